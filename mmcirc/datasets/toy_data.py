"""Deterministic toy datasets for fast smoke-training of mmcirc backbones: three tiny
datasets of the scenes of :mod:`.toy_scenes`, in the on-disk layouts of mmdet's
``CocoDataset`` (:func:`make_toy_coco`), mmseg's ADE20K (:func:`make_toy_ade`) and
mmpretrain's ``CustomDataset`` (:func:`make_toy_imagenet`).

Every image is drawn from its own ``numpy.random.Generator`` seeded by
``(seed, dataset, split, index)``, so the same seed gives byte-identical files and
changing ``num_train`` does not change the validation split. Each dataset is written
into a temporary sibling directory and moved into place only when complete. numpy and
Pillow only (no mmengine / mmdet imports).
"""

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

from .toy_scenes import (  # noqa: F401  (the classes and palettes, for the configs)
    TOY_CLS_CLASSES,
    TOY_DET_CLASSES,
    TOY_DET_PALETTE,
    TOY_SEG_CLASSES,
    TOY_SEG_PALETTE,
    render_scene,
)

__all__ = [
    'DATASETS',
    'DEFAULT_IMG_SIZES',
    'DEFAULT_NUM_TRAIN',
    'DEFAULT_NUM_VAL',
    'MIN_IMG_SIZE',
    'parse_img_size',
    'make_toy_coco',
    'make_toy_ade',
    'make_toy_imagenet',
    'make_toy_data',
]

#: Dataset names accepted by :func:`make_toy_data` (plus ``'all'``).
DATASETS = ('coco', 'ade', 'imagenet')
#: Default ``(height, width)`` per dataset.
DEFAULT_IMG_SIZES = {'coco': (128, 160), 'ade': (128, 128), 'imagenet': (64, 64)}
#: Default number of training images per dataset.
DEFAULT_NUM_TRAIN = 200
#: Default number of validation images per dataset.
DEFAULT_NUM_VAL = 50
#: Smallest accepted image side, in pixels.
MIN_IMG_SIZE = 32
_MAX_IMG_SIZE = 4096
_JPEG_QUALITY = 90
_DATASET_KEYS = {'coco': 1, 'ade': 2, 'imagenet': 3}
_SPLIT_KEYS = {'train': 0, 'val': 1}


def _check_int(name, value, least=1, wording='an integer >= 1'):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f'{name} must be {wording}, got {value!r}')
    return int(value)


def parse_img_size(value, name='img_size'):
    """``(height, width)`` of an int ``S`` (square), a ``(height, width)`` pair or a string
    ``'S'`` / ``'HxW'`` (``'128x160'``: 128 rows, 160 columns); ``ValueError`` naming
    ``name`` for anything else or a side outside [:data:`MIN_IMG_SIZE`, 4096]."""
    size = None
    if isinstance(value, str):
        try:
            size = tuple(int(p) for p in value.lower().replace('*', 'x').split('x'))
        except ValueError:
            pass
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        size = (int(value),)
    elif isinstance(value, (tuple, list)) and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value
    ):
        size = tuple(int(v) for v in value)
    if size is None or len(size) not in (1, 2):
        raise ValueError(
            f"{name} must be an int, 'HxW' string or (height, width) pair, got {value!r}"
        )
    size = size * 2 if len(size) == 1 else size
    if min(size) < MIN_IMG_SIZE or max(size) > _MAX_IMG_SIZE:
        raise ValueError(
            f'{name} sides must be in [{MIN_IMG_SIZE}, {_MAX_IMG_SIZE}] pixels, got {value!r}'
        )
    return size


def _resolve_datasets(datasets):
    if isinstance(datasets, str):
        datasets = [datasets]
    try:
        datasets = list(datasets)
    except TypeError:
        raise ValueError(
            f'datasets must be a name or list of names from {DATASETS + ("all",)}, got {datasets!r}'
        ) from None
    if not datasets:
        raise ValueError('datasets must name at least one dataset')
    out = []
    for d in datasets:
        if d != 'all' and d not in DATASETS:
            raise ValueError(
                f'unknown dataset {d!r}: datasets must be one of {DATASETS + ("all",)}'
            )
        out.extend(n for n in (DATASETS if d == 'all' else (d,)) if n not in out)
    return out


def _rng(seed, dataset, split, index):
    return np.random.default_rng([seed, _DATASET_KEYS[dataset], _SPLIT_KEYS[split], index])


def _save_jpg(arr, path):
    Image.fromarray(arr, mode='RGB').save(path, format='JPEG', quality=_JPEG_QUALITY)


def _save_png(arr, path):
    Image.fromarray(arr, mode='L').save(path, format='PNG')


@contextmanager
def _atomic_dir(final):
    """Yield a fresh temp dir next to ``final``; on success replace ``final``
    with it, on failure delete it and leave ``final`` untouched."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{final.name}.tmp-', dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    trash = None
    if final.exists() or final.is_symlink():
        trash = Path(tempfile.mkdtemp(prefix=f'.{final.name}.old-', dir=final.parent))
        os.rename(final, trash / final.name)
    try:
        os.rename(tmp, final)
    except BaseException:
        if trash is not None:
            os.rename(trash / final.name, final)
            shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def _prepare(out_dir, num_train, num_val, img_size, seed, dataset):
    """The checked arguments of a ``make_toy_*`` (``ValueError`` naming a bad one)."""
    num_train = _check_int('num_train', num_train)
    num_val = _check_int('num_val', num_val)
    seed = _check_int('seed', seed, 0, 'a non-negative integer')
    size = parse_img_size(DEFAULT_IMG_SIZES[dataset] if img_size is None else img_size)
    return Path(out_dir), num_train, num_val, size, seed


def make_toy_coco(
    out_dir='data', num_train=DEFAULT_NUM_TRAIN, num_val=DEFAULT_NUM_VAL, img_size=None, seed=0
):
    """Write the COCO-format detection/instance-segmentation toy dataset.

    Layout (same as ``data/coco``)::

        <out_dir>/toy_coco/train2017/000000000001.jpg ...
        <out_dir>/toy_coco/val2017/000000000001.jpg ...
        <out_dir>/toy_coco/annotations/instances_{train2017,val2017}.json

    Each image holds 1-4 shapes; each annotation has a polygon
    ``segmentation`` (the drawn polygon's vertices + 0.5, i.e. through the
    centres of its boundary pixels), ``bbox`` ``[x, y, w, h]`` (integers, the
    exact extent of the painted pixels) and ``area`` (painted pixel count,
    including any part later covered by an overlapping shape), ``iscrowd`` 0
    and ``category_id`` in ``1..len(TOY_DET_CLASSES)``.

    Arguments as :func:`make_toy_data`'s; returns ``root`` (the Path of ``toy_coco``) and
    per split its image and annotation counts.
    """
    out_dir, num_train, num_val, (h, w), seed = _prepare(
        out_dir, num_train, num_val, img_size, seed, 'coco'
    )
    categories = [
        dict(id=i + 1, name=name, supercategory='shape') for i, name in enumerate(TOY_DET_CLASSES)
    ]
    summary = dict(root=out_dir / 'toy_coco')
    with _atomic_dir(out_dir / 'toy_coco') as root:
        (root / 'annotations').mkdir()
        for split, num in (('train', num_train), ('val', num_val)):
            folder = f'{split}2017'
            (root / folder).mkdir()
            images, annotations = [], []
            for i in range(num):
                scene = render_scene(_rng(seed, 'coco', split, i), w, h)
                image_id = i + 1
                file_name = f'{image_id:012d}.jpg'
                _save_jpg(scene['image'], root / folder / file_name)
                images.append(dict(id=image_id, file_name=file_name, width=w, height=h))
                for obj in scene['objects']:
                    ys, xs = np.nonzero(obj['mask'])
                    x0, y0 = int(xs.min()), int(ys.min())
                    annotations.append(
                        dict(
                            id=len(annotations) + 1,
                            image_id=image_id,
                            category_id=obj['label'] + 1,
                            segmentation=[[c + 0.5 for p in obj['polygon'] for c in p]],
                            area=int(obj['mask'].sum()),
                            bbox=[x0, y0, int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1],
                            iscrowd=0,
                        )
                    )
            coco = dict(
                info=dict(
                    description='mmcirc toy COCO-format shapes dataset', version='1.0', seed=seed
                ),
                licenses=[],
                images=images,
                annotations=annotations,
                categories=categories,
            )
            with open(root / 'annotations' / f'instances_{folder}.json', 'w') as f:
                f.write(json.dumps(coco, separators=(',', ':')))
            summary[split] = dict(images=num, annotations=len(annotations))
    return summary


def make_toy_ade(
    out_dir='data', num_train=DEFAULT_NUM_TRAIN, num_val=DEFAULT_NUM_VAL, img_size=None, seed=0
):
    """Write the ADE20K-format semantic segmentation toy dataset.

    Layout (same as ``ADEChallengeData2016``)::

        <out_dir>/toy_ade/ADEChallengeData2016/images/training/ADE_train_00000001.jpg
        <out_dir>/toy_ade/ADEChallengeData2016/annotations/training/ADE_train_00000001.png
        ... validation/ADE_val_00000001.{jpg,png}

    Annotations are single-channel uint8 PNGs: ``0`` = unlabelled (the
    horizon line and shape outlines, a few percent of the pixels) and
    ``i + 1`` for ``TOY_SEG_CLASSES[i]``; load them with
    ``reduce_zero_label=True`` and
    ``metainfo=dict(classes=TOY_SEG_CLASSES, palette=TOY_SEG_PALETTE)``.

    Arguments as :func:`make_toy_data`'s; returns ``root`` (the Path of
    ``toy_ade/ADEChallengeData2016``) and per split its image count.
    """
    out_dir, num_train, num_val, (h, w), seed = _prepare(
        out_dir, num_train, num_val, img_size, seed, 'ade'
    )
    summary = dict(root=out_dir / 'toy_ade' / 'ADEChallengeData2016')
    with _atomic_dir(out_dir / 'toy_ade') as top:
        root = top / 'ADEChallengeData2016'
        for split, num, folder, prefix in (
            ('train', num_train, 'training', 'ADE_train'),
            ('val', num_val, 'validation', 'ADE_val'),
        ):
            img_dir = root / 'images' / folder
            ann_dir = root / 'annotations' / folder
            img_dir.mkdir(parents=True)
            ann_dir.mkdir(parents=True)
            for i in range(num):
                scene = render_scene(_rng(seed, 'ade', split, i), w, h)
                stem = f'{prefix}_{i + 1:08d}'
                _save_jpg(scene['image'], img_dir / f'{stem}.jpg')
                _save_png(scene['seg'], ann_dir / f'{stem}.png')
            summary[split] = dict(images=num)
    return summary


def make_toy_imagenet(
    out_dir='data', num_train=DEFAULT_NUM_TRAIN, num_val=DEFAULT_NUM_VAL, img_size=None, seed=0
):
    """Write the ImageNet-style image-folder classification toy dataset.

    Layout::

        <out_dir>/toy_imagenet/{train,val}/<class>/<class>_00000.jpg
        <out_dir>/toy_imagenet/meta/{train,val}.txt   # "<class>/<file>.jpg <label>"

    One large shape per image; image ``i`` of a split has class
    ``TOY_CLS_CLASSES[i % 3]``. Works with mmpretrain's ``CustomDataset``
    either by folder scan (``data_prefix='train'``) or with
    ``ann_file='meta/train.txt'``.

    Arguments as :func:`make_toy_data`'s; returns ``root`` (the Path of ``toy_imagenet``)
    and per split its image count and per-class counts.
    """
    out_dir, num_train, num_val, (h, w), seed = _prepare(
        out_dir, num_train, num_val, img_size, seed, 'imagenet'
    )
    summary = dict(root=out_dir / 'toy_imagenet')
    with _atomic_dir(out_dir / 'toy_imagenet') as root:
        (root / 'meta').mkdir()
        for split, num in (('train', num_train), ('val', num_val)):
            for name in TOY_CLS_CLASSES:
                (root / split / name).mkdir(parents=True)
            lines, per_class = [], [0] * len(TOY_CLS_CLASSES)
            for i in range(num):
                label = i % len(TOY_CLS_CLASSES)
                name = TOY_CLS_CLASSES[label]
                scene = render_scene(
                    _rng(seed, 'imagenet', split, i), w, h, labels=[label], size_range=(0.22, 0.36)
                )
                rel = f'{name}/{name}_{i:05d}.jpg'
                _save_jpg(scene['image'], root / split / rel)
                lines.append(f'{rel} {label}\n')
                per_class[label] += 1
            with open(root / 'meta' / f'{split}.txt', 'w') as f:
                f.writelines(lines)
            summary[split] = dict(images=num, per_class=per_class)
    return summary


_MAKERS = dict(coco=make_toy_coco, ade=make_toy_ade, imagenet=make_toy_imagenet)


def make_toy_data(
    datasets='all',
    out_dir='data',
    num_train=DEFAULT_NUM_TRAIN,
    num_val=DEFAULT_NUM_VAL,
    img_size=None,
    seed=0,
):
    """Generate one or more toy datasets under ``out_dir``; a bad argument is a
    ``ValueError`` naming it, before anything is written (each ``make_toy_*`` checks its
    arguments first).

    ``datasets``: ``'coco'``, ``'ade'``, ``'imagenet'``, ``'all'`` or a list of those;
    ``out_dir``: the parent folder; ``num_train`` / ``num_val``: images per split and
    dataset (>= 1); ``img_size``: ``(height, width)`` of every dataset's images
    (:func:`parse_img_size`; None: :data:`DEFAULT_IMG_SIZES`); ``seed``: >= 0. Returns
    {dataset name: the summary its ``make_toy_*`` returns}.
    """
    names = _resolve_datasets(datasets)
    return {
        name: _MAKERS[name](
            out_dir=out_dir, num_train=num_train, num_val=num_val, img_size=img_size, seed=seed
        )
        for name in names
    }
