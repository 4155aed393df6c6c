"""Deterministic toy datasets for fast smoke-training of mmcirc backbones.

Three tiny datasets of coloured shapes on a textured two-tone background
("sky" above a slightly tilted horizon, "ground" below), written in the exact
on-disk layouts the OpenMMLab dataset classes expect:

* ``toy_coco``: COCO-format detection + instance segmentation, loadable by
  mmdet's ``CocoDataset`` (``ann_file='annotations/instances_train2017.json'``,
  ``data_prefix=dict(img='train2017/')``, ``metainfo=dict(classes=TOY_DET_CLASSES)``).
* ``toy_ade/ADEChallengeData2016``: ADE20K-format semantic segmentation; the
  annotation PNGs are single-channel uint8 with ``0`` = unlabelled and classes
  ``1..K`` (``K = len(TOY_SEG_CLASSES)``), so ``reduce_zero_label=True`` maps
  them to ``255`` (ignore) and ``0..K-1``. Use
  ``metainfo=dict(classes=TOY_SEG_CLASSES, palette=TOY_SEG_PALETTE)``.
* ``toy_imagenet``: image-folder classification (``{train,val}/<class>/*.jpg``)
  plus ``meta/{train,val}.txt`` in mmpretrain's ``path label`` format, loadable
  by mmpretrain's ``CustomDataset`` (classes ``TOY_CLS_CLASSES``, which is the
  alphabetical folder order).

Every image is drawn from its own ``numpy.random.Generator`` seeded by
``(seed, dataset, split, index)``, so the same seed gives byte-identical files
and changing ``num_train`` does not change the validation split. Polygons are
rasterised with ``PIL.ImageDraw`` and the very same polygon is stored in the
COCO ``segmentation`` field, shifted by +0.5 from PIL's pixel-index vertices
to COCO's continuous coordinates (pixel ``i`` spans ``[i, i + 1)``), so the
painted pixels, the pycocotools-decoded polygon and the ``bbox`` agree to
within one pixel (circles are 32-gons). Each dataset is written into a temporary sibling directory and moved
into place only when complete.

This module depends on numpy and Pillow only (no mmengine/mmdet imports).
"""

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

from .toy_scenes import (  # noqa: F401  (re-exported)
    TOY_CLS_CLASSES,
    TOY_DET_CLASSES,
    TOY_DET_PALETTE,
    TOY_SEG_CLASSES,
    TOY_SEG_PALETTE,
    render_scene,
)


__all__ = [
    'TOY_DET_CLASSES',
    'TOY_DET_PALETTE',
    'TOY_SEG_CLASSES',
    'TOY_SEG_PALETTE',
    'TOY_CLS_CLASSES',
    'DATASETS',
    'DEFAULT_IMG_SIZES',
    'DEFAULT_NUM_TRAIN',
    'DEFAULT_NUM_VAL',
    'MIN_IMG_SIZE',
    'parse_img_size',
    'render_scene',
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


# ----------------------------------------------------------------------------
# argument checking
# ----------------------------------------------------------------------------
def _check_count(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f'{name} must be an integer >= 1, got {value!r}')
    return int(value)


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f'seed must be a non-negative integer, got {seed!r}')
    return int(seed)


def parse_img_size(value, name='img_size'):
    """Parse an image size into a ``(height, width)`` tuple of ints.

    Args:
        value: an int ``S`` (square ``S x S``), a ``(height, width)`` pair, or a
            string ``'S'`` or ``'HxW'`` (e.g. ``'128x160'``: 128 rows, 160 columns).
        name (str): argument name used in error messages.

    Returns:
        tuple[int, int]: ``(height, width)``.

    Raises:
        ValueError: if the value cannot be parsed or a side is smaller than
            :data:`MIN_IMG_SIZE` (or larger than 4096).
    """
    size = None
    if isinstance(value, str):
        parts = value.lower().replace('*', 'x').split('x')
        try:
            size = tuple(int(p) for p in parts)
        except ValueError:
            size = None
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
    if len(size) == 1:
        size = (size[0], size[0])
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
        if d == 'all':
            names = DATASETS
        elif d in DATASETS:
            names = (d,)
        else:
            raise ValueError(
                f'unknown dataset {d!r}: datasets must be one of {DATASETS + ("all",)}'
            )
        out.extend(n for n in names if n not in out)
    return out


# ----------------------------------------------------------------------------
# rendering
# ----------------------------------------------------------------------------
def _rng(seed, dataset, split, index):
    return np.random.default_rng([seed, _DATASET_KEYS[dataset], _SPLIT_KEYS[split], index])


def _save_jpg(arr, path):
    Image.fromarray(arr, mode='RGB').save(path, format='JPEG', quality=_JPEG_QUALITY)


def _save_png(arr, path):
    Image.fromarray(arr, mode='L').save(path, format='PNG')


def _write_json(obj, path):
    with open(path, 'w', encoding='utf-8') as f:
        f.write(json.dumps(obj, separators=(',', ':')))


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
    num_train = _check_count('num_train', num_train)
    num_val = _check_count('num_val', num_val)
    seed = _check_seed(seed)
    size = parse_img_size(DEFAULT_IMG_SIZES[dataset] if img_size is None else img_size)
    return Path(out_dir), num_train, num_val, size, seed


# ----------------------------------------------------------------------------
# datasets
# ----------------------------------------------------------------------------
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

    Args:
        out_dir (str | Path): parent directory (``toy_coco`` is created in it).
        num_train (int): number of training images (>= 1).
        num_val (int): number of validation images (>= 1).
        img_size (int | str | tuple, optional): ``(height, width)``, see
            :func:`parse_img_size`; default ``(128, 160)``.
        seed (int): non-negative random seed.

    Returns:
        dict: ``root`` (Path of ``toy_coco``) and per-split image and
        annotation counts.
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
            _write_json(coco, root / 'annotations' / f'instances_{folder}.json')
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

    Args:
        out_dir (str | Path): parent directory (``toy_ade`` is created in it).
        num_train (int): number of training images (>= 1).
        num_val (int): number of validation images (>= 1).
        img_size (int | str | tuple, optional): ``(height, width)``, see
            :func:`parse_img_size`; default ``(128, 128)``.
        seed (int): non-negative random seed.

    Returns:
        dict: ``root`` (Path of ``toy_ade/ADEChallengeData2016``) and
        per-split image counts.
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

    Args:
        out_dir (str | Path): parent directory (``toy_imagenet`` is created).
        num_train (int): number of training images (>= 1).
        num_val (int): number of validation images (>= 1).
        img_size (int | str | tuple, optional): ``(height, width)``, see
            :func:`parse_img_size`; default ``(64, 64)``.
        seed (int): non-negative random seed.

    Returns:
        dict: ``root`` (Path of ``toy_imagenet``) and per-split image counts
        and per-class counts.
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
    """Generate one or more toy datasets under ``out_dir``.

    All arguments are validated before anything is written.

    Args:
        datasets (str | list[str]): ``'coco'``, ``'ade'``, ``'imagenet'`` or
            ``'all'``, or a list of those.
        out_dir (str | Path): parent output directory (default ``'data'``).
        num_train (int): training images per dataset (>= 1).
        num_val (int): validation images per dataset (>= 1).
        img_size (int | str | tuple, optional): ``(height, width)`` for every
            selected dataset; None uses :data:`DEFAULT_IMG_SIZES`.
        seed (int): non-negative random seed.

    Returns:
        dict: dataset name -> summary dict from the ``make_toy_*`` function.

    Raises:
        ValueError: naming the offending argument.
    """
    names = _resolve_datasets(datasets)
    _check_count('num_train', num_train)
    _check_count('num_val', num_val)
    _check_seed(seed)
    if img_size is not None:
        parse_img_size(img_size)
    return {
        name: _MAKERS[name](
            out_dir=out_dir, num_train=num_train, num_val=num_val, img_size=img_size, seed=seed
        )
        for name in names
    }
