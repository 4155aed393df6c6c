"""Tests for the toy dataset generator (mmcirc/datasets/toy_data.py and its CLI)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmcirc.datasets import toy_data
from mmcirc.datasets.toy_data import (
    TOY_CLS_CLASSES,
    TOY_DET_CLASSES,
    TOY_DET_PALETTE,
    TOY_SEG_CLASSES,
    TOY_SEG_PALETTE,
    make_toy_data,
)

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / 'tools' / 'dataset_converters' / 'make_toy_data.py'
NUM_TRAIN, NUM_VAL = 9, 4
ADE = Path('toy_ade') / 'ADEChallengeData2016'


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('toy')
    make_toy_data('all', root, num_train=NUM_TRAIN, num_val=NUM_VAL, seed=0)
    return root


def _files(root):
    """Relative path -> bytes of every file under root."""
    root = Path(root)
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob('*'))
        if p.is_file()
    }


# ---------------------------------------------------------------- determinism
def test_same_seed_is_byte_identical_and_other_seed_differs(toy_root, tmp_path):
    make_toy_data('all', tmp_path / 'a', num_train=NUM_TRAIN, num_val=NUM_VAL, seed=0)
    make_toy_data('all', tmp_path / 'b', num_train=NUM_TRAIN, num_val=NUM_VAL, seed=1)
    ref, same, other = _files(toy_root), _files(tmp_path / 'a'), _files(tmp_path / 'b')
    assert len(ref) > 3 * (NUM_TRAIN + NUM_VAL)
    assert sorted(same) == sorted(ref)
    for rel in ref:  # JSON, PNG, txt and (same Pillow) JPEG bytes
        assert same[rel] == ref[rel], rel
    assert sorted(other) == sorted(ref)  # same layout and names ...
    for suffix in ('.json', '.png', '.jpg'):  # ... different content
        changed = [r for r in ref if r.endswith(suffix) and other[r] != ref[r]]
        assert changed, suffix
    assert (
        other['toy_coco/annotations/instances_train2017.json']
        != ref['toy_coco/annotations/instances_train2017.json']
    )


def test_val_split_does_not_depend_on_num_train(toy_root, tmp_path):
    make_toy_data('coco', tmp_path, num_train=3, num_val=NUM_VAL, seed=0)
    name = 'toy_coco/annotations/instances_val2017.json'
    assert (tmp_path / name).read_bytes() == (toy_root / name).read_bytes()


# ----------------------------------------------------------------------- COCO
@pytest.mark.parametrize('split,num', [('train', NUM_TRAIN), ('val', NUM_VAL)])
def test_coco_annotations_match_polygons_and_images(toy_root, split, num):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    root = toy_root / 'toy_coco'
    coco = COCO(str(root / 'annotations' / f'instances_{split}2017.json'))
    assert len(coco.imgs) == num
    assert [c['id'] for c in coco.loadCats(coco.getCatIds())] == [1, 2, 3]
    assert [c['name'] for c in coco.loadCats([1, 2, 3])] == list(TOY_DET_CLASSES)
    assert sorted(p.name for p in (root / f'{split}2017').iterdir()) == sorted(
        img['file_name'] for img in coco.imgs.values()
    )

    seen_cats = set()
    for img_id, img in coco.imgs.items():
        with Image.open(root / f'{split}2017' / img['file_name']) as im:
            assert im.size == (img['width'], img['height'])
            assert im.mode == 'RGB'
            pixels = np.asarray(im, dtype=np.float64)
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[img_id]))
        assert 1 <= len(anns) <= 4
        masks = []
        for ann in anns:
            assert ann['iscrowd'] == 0
            assert ann['category_id'] in (1, 2, 3)
            seen_cats.add(ann['category_id'])
            poly = ann['segmentation']
            assert isinstance(poly, list) and len(poly[0]) >= 6
            rles = mask_utils.frPyObjects(poly, img['height'], img['width'])
            mask = mask_utils.decode(mask_utils.merge(rles)).astype(bool)
            ys, xs = np.nonzero(mask)
            mask_box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            x, y, w, h = ann['bbox']
            assert w > 0 and h > 0
            assert x >= 0 and y >= 0
            assert x + w <= img['width'] and y + h <= img['height']
            np.testing.assert_allclose([x, y, x + w, y + h], mask_box, atol=1)
            assert abs(mask.sum() - ann['area']) <= 0.15 * ann['area']
            masks.append(mask)
        # the annotation describes what is painted: the visible part of each
        # shape has the colour of its class, not of another class
        palette = np.asarray(TOY_DET_PALETTE, dtype=np.float64)
        for i, ann in enumerate(anns):
            visible = masks[i].copy()
            for j in range(i + 1, len(anns)):
                visible &= ~masks[j]
            if visible.sum() < 20:
                continue
            mean = pixels[visible].mean(axis=0)
            nearest = np.argmin(((palette - mean) ** 2).sum(axis=1))
            assert nearest + 1 == ann['category_id']
            ring = np.zeros_like(visible)
            x, y, w, h = ann['bbox']
            # background just outside the bbox looks different from the shape
            ring[max(y - 3, 0) : y + h + 3, max(x - 3, 0) : x + w + 3] = True
            ring &= ~np.any(masks, axis=0)
            if ring.sum() > 20:
                assert np.abs(pixels[ring].mean(axis=0) - mean).max() > 40
    if split == 'train':
        assert seen_cats == {1, 2, 3}


# ------------------------------------------------------------------------ ADE
def test_ade_layout_and_labels(toy_root):
    root = toy_root / ADE
    num_classes = len(TOY_SEG_CLASSES)
    assert len(TOY_SEG_PALETTE) == num_classes
    zero_fracs = []
    palette = np.asarray(TOY_SEG_PALETTE, dtype=np.float64)
    color_sums = np.zeros((num_classes + 1, 3))
    counts = np.zeros(num_classes + 1)
    for split, prefix, num in (
        ('training', 'ADE_train', NUM_TRAIN),
        ('validation', 'ADE_val', NUM_VAL),
    ):
        imgs = sorted((root / 'images' / split).iterdir())
        anns = sorted((root / 'annotations' / split).iterdir())
        assert [p.name for p in imgs] == [f'{prefix}_{i:08d}.jpg' for i in range(1, num + 1)]
        assert [p.stem for p in anns] == [p.stem for p in imgs]
        assert all(p.suffix == '.png' for p in anns)
        for img_path, ann_path in zip(imgs, anns):
            with Image.open(img_path) as im, Image.open(ann_path) as seg:
                assert im.mode == 'RGB'
                assert seg.mode == 'L'
                assert seg.size == im.size
                labels = np.asarray(seg)
                pixels = np.asarray(im, dtype=np.float64)
            assert labels.dtype == np.uint8 and labels.ndim == 2
            assert labels.max() <= num_classes
            assert {1, 2} <= set(np.unique(labels).tolist())  # sky + ground
            zero_fracs.append((labels == 0).mean())
            for k in range(num_classes + 1):
                color_sums[k] += pixels[labels == k].sum(axis=0)
                counts[k] += (labels == k).sum()
    # labels describe the image: each class's mean colour is closest to its
    # own palette entry (shape colours, sky above ground)
    assert (counts > 0).all()
    means = color_sums[1:] / counts[1:, None]
    dists = ((means[:, None] - palette[None]) ** 2).sum(axis=2)
    assert dists.argmin(axis=1).tolist() == list(range(num_classes))
    zero_fracs = np.asarray(zero_fracs)
    assert (zero_fracs > 0).all()  # every map has some ignore pixels ...
    assert zero_fracs.max() < 0.1  # ... but few of them


# ------------------------------------------------------------------- ImageNet
def test_imagenet_layout_and_meta(toy_root):
    root = toy_root / 'toy_imagenet'
    assert list(TOY_CLS_CLASSES) == sorted(TOY_CLS_CLASSES)  # folder order
    for split, num in (('train', NUM_TRAIN), ('val', NUM_VAL)):
        assert sorted(p.name for p in (root / split).iterdir()) == list(TOY_CLS_CLASSES)
        files = sorted(
            p.relative_to(root / split).as_posix() for p in (root / split).rglob('*.jpg')
        )
        assert len(files) == num
        lines = (root / 'meta' / f'{split}.txt').read_text().splitlines()
        entries = [line.split(' ') for line in lines]
        assert sorted(e[0] for e in entries) == files
        for rel, label in entries:
            assert TOY_CLS_CLASSES[int(label)] == rel.split('/')[0]
            with Image.open(root / split / rel) as im:
                assert im.size == (64, 64) and im.mode == 'RGB'
        counts = np.bincount([int(e[1]) for e in entries], minlength=3)
        assert counts.max() - counts.min() <= 1


# -------------------------------------------------------- arguments and I/O
@pytest.mark.parametrize(
    'kwargs,name',
    [
        (dict(num_train=0), 'num_train'),
        (dict(num_val=-1), 'num_val'),
        (dict(num_val=2.5), 'num_val'),
        (dict(img_size=16), 'img_size'),
        (dict(img_size='160x8'), 'img_size'),
        (dict(img_size='big'), 'img_size'),
        (dict(seed=-1), 'seed'),
        (dict(datasets='cityscapes'), 'dataset'),
        (dict(datasets=[]), 'dataset'),
    ],
)
def test_bad_arguments_raise_value_error_and_write_nothing(tmp_path, kwargs, name):
    args = dict(datasets='all', out_dir=tmp_path / 'out', num_train=2, num_val=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        make_toy_data(**args)
    assert not (tmp_path / 'out').exists() or not any((tmp_path / 'out').iterdir())


def test_img_size_is_height_by_width(tmp_path):
    assert toy_data.parse_img_size('128x160') == (128, 160)
    assert toy_data.parse_img_size((64, 96)) == (64, 96)
    assert toy_data.parse_img_size(96) == (96, 96)
    make_toy_data(
        ['ade', 'coco'], tmp_path, num_train=1, num_val=1, img_size='64x96'
    )  # 64 rows, 96 columns
    ann = json.loads((tmp_path / 'toy_coco/annotations/instances_val2017.json').read_text())
    assert (ann['images'][0]['height'], ann['images'][0]['width']) == (64, 96)
    with Image.open(tmp_path / ADE / 'annotations/training/ADE_train_00000001.png') as seg:
        assert seg.size == (96, 64)  # PIL: (width, height)
    assert not (tmp_path / 'toy_imagenet').exists()


def test_default_coco_images_are_160_wide_128_high(toy_root):
    ann = json.loads((toy_root / 'toy_coco/annotations/instances_val2017.json').read_text())
    assert {(i['height'], i['width']) for i in ann['images']} == {(128, 160)}
    assert toy_data.DEFAULT_IMG_SIZES['coco'] == (128, 160)


def test_rerun_overwrites_cleanly_and_failure_keeps_old_data(tmp_path, monkeypatch):
    make_toy_data('ade', tmp_path, num_train=5, num_val=2, seed=0)
    make_toy_data('ade', tmp_path, num_train=2, num_val=1, seed=0)
    assert len(list((tmp_path / ADE / 'images/training').iterdir())) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ['toy_ade']
    before = _files(tmp_path)

    calls = []

    def failing_save(arr, path):
        calls.append(path)
        if len(calls) == 3:
            raise OSError('disk full')
        Image.fromarray(arr, mode='L').save(path, format='PNG')

    monkeypatch.setattr(toy_data, '_save_png', failing_save)
    with pytest.raises(OSError, match='disk full'):
        make_toy_data('ade', tmp_path, num_train=4, num_val=2, seed=3)
    assert len(calls) == 3
    assert _files(tmp_path) == before  # old data intact, no temp dirs left
    assert sorted(p.name for p in tmp_path.iterdir()) == ['toy_ade']


def test_cli(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(CLI),
            'coco',
            'imagenet',
            '--out',
            str(tmp_path),
            '--seed',
            '0',
            '--num-train',
            '3',
            '--num-val',
            '2',
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ['toy_coco', 'toy_imagenet']
    ref = tmp_path / 'ref'
    make_toy_data('coco', ref, num_train=3, num_val=2, seed=0)
    assert _files(tmp_path / 'toy_coco') == _files(ref / 'toy_coco')


def _run_cli(argv, cwd):
    """The tool as users run it: its own process, exit code and stderr."""
    return subprocess.run(
        [sys.executable, str(CLI), *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize(
    'argv,name',
    [
        (['coco', '--num-val', '0'], 'num_val'),
        (['voc'], 'voc'),
        (['coco', '--img-size', '160x8'], 'img_size'),
    ],
)
def test_cli_bad_argument_is_one_error_line_exit_1(tmp_path, argv, name):
    out = _run_cli(argv + ['--out', str(tmp_path / 'x')], tmp_path)
    assert out.returncode == 1
    assert out.stderr.startswith('error: ') and out.stderr.count('\n') == 1, out.stderr
    assert name in out.stderr
    assert not (tmp_path / 'x').exists()


def test_cli_img_size_is_height_by_width(tmp_path):
    argv = ['coco', '--out', str(tmp_path), '--num-train', '1', '--num-val', '1']
    out = _run_cli(argv + ['--img-size', '64x96'], tmp_path)
    assert out.returncode == 0, out.stderr
    with Image.open(tmp_path / 'toy_coco/val2017/000000000001.jpg') as img:
        assert img.size == (96, 64)  # PIL: (width, height)


# ------------------------------------------- loading through OpenMMLab classes
def test_mmdet_coco_dataset_loads_toy_coco(toy_root):
    from mmcv.transforms import LoadImageFromFile
    from mmdet.datasets import CocoDataset
    from mmdet.datasets.transforms import LoadAnnotations

    for split, num in (('train', NUM_TRAIN), ('val', NUM_VAL)):
        ds = CocoDataset(
            data_root=str(toy_root / 'toy_coco'),
            ann_file=f'annotations/instances_{split}2017.json',
            data_prefix=dict(img=f'{split}2017/'),
            metainfo=dict(classes=TOY_DET_CLASSES, palette=TOY_DET_PALETTE),
            filter_cfg=dict(filter_empty_gt=True, min_size=4),
            pipeline=[LoadImageFromFile(), LoadAnnotations(with_bbox=True, with_mask=True)],
        )
        assert len(ds) == num
        assert ds.metainfo['classes'] == TOY_DET_CLASSES
        sample = ds[0]
        img = sample['img']
        assert img.shape == (128, 160, 3)
        boxes = sample['gt_bboxes'].tensor.numpy()
        labels = sample['gt_bboxes_labels']
        assert boxes.shape == (len(labels), 4) and 1 <= len(labels) <= 4
        assert set(labels.tolist()) <= {0, 1, 2}
        masks = sample['gt_masks'].to_ndarray()
        assert masks.shape == (len(labels), 128, 160)
        for box, mask in zip(boxes, masks):
            ys, xs = np.nonzero(mask)
            np.testing.assert_allclose(
                box, [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], atol=1
            )


def test_mmseg_base_seg_dataset_loads_toy_ade(toy_root):
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets import BaseSegDataset
    from mmseg.datasets.transforms import LoadAnnotations

    root = toy_root / ADE
    num_classes = len(TOY_SEG_CLASSES)
    ds = BaseSegDataset(
        data_root=str(root),
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        img_suffix='.jpg',
        seg_map_suffix='.png',
        reduce_zero_label=True,
        metainfo=dict(classes=TOY_SEG_CLASSES, palette=TOY_SEG_PALETTE),
        pipeline=[LoadImageFromFile(), LoadAnnotations()],
    )
    assert len(ds) == NUM_VAL
    assert ds.metainfo['classes'] == TOY_SEG_CLASSES
    sample = ds[0]
    assert sample['img'].shape == (128, 128, 3)
    gt = sample['gt_seg_map']
    raw = np.asarray(Image.open(sample['seg_map_path']))
    assert Path(sample['seg_map_path']).stem == Path(sample['img_path']).stem
    assert gt.shape == raw.shape
    assert set(np.unique(gt).tolist()) <= set(range(num_classes)) | {255}
    assert (gt[raw == 0] == 255).all()
    assert (gt[raw > 0] == raw[raw > 0].astype(np.int64) - 1).all()
    assert 0 < (gt == 255).mean() < 0.1


def test_mmpretrain_custom_dataset_loads_toy_imagenet(toy_root):
    from mmpretrain.datasets import CustomDataset

    root = str(toy_root / 'toy_imagenet')
    scanned = CustomDataset(data_root=root, data_prefix='train', pipeline=[])
    assert len(scanned) == NUM_TRAIN
    assert tuple(scanned.CLASSES) == TOY_CLS_CLASSES
    from_meta = CustomDataset(
        data_root=root,
        data_prefix='val',
        ann_file='meta/val.txt',
        metainfo=dict(classes=TOY_CLS_CLASSES),
        pipeline=[],
    )
    assert len(from_meta) == NUM_VAL
    for ds in (scanned, from_meta):
        for i in range(len(ds)):
            info = ds[i]
            assert os.path.isfile(info['img_path'])
            label = int(info['gt_label'])
            assert Path(info['img_path']).parent.name == TOY_CLS_CLASSES[label]
