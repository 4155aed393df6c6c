"""Each task family end to end on the generated data: tools/train.py a few iterations
(the loss goes down), then tools/test.py produces the task's metric.

The configs in tests/fixtures/configs inherit the real ones in configs/ and only shrink
widths, image sizes and schedules.
"""
import json
import os.path as osp

import pytest

from helpers import FIXTURE_CONFIGS, run_tool

FAMILIES = {
    'retinanet': ('ca_pvt_retinanet_tiny.py', 'coco/bbox_mAP'),
    'mask-rcnn': ('core_swin_mask-rcnn_tiny.py', 'coco/segm_mAP'),
    'upernet': ('ca_swin_upernet_tiny.py', 'mIoU'),
    'semantic-fpn': ('ca_pvt_fpn_tiny.py', 'mIoU'),
    'classification': ('core_pvt_cls_tiny.py', 'accuracy/top1'),
}


def train_losses(work_dir):
    """The per-iteration training losses mmengine logged to vis_data/scalars.json."""
    (scalars, ) = sorted(work_dir.glob('*/vis_data/scalars.json'))[-1:]
    rows = [json.loads(line) for line in scalars.read_text().splitlines()]
    return [r['loss'] for r in rows if 'loss' in r]


def train(config, work_dir, cwd, *extra):
    return run_tool(['tools/train.py', osp.join(FIXTURE_CONFIGS, config), '--work-dir',
                     str(work_dir), *extra], cwd=cwd)


def evaluate(config, checkpoint, work_dir, cwd, *extra):
    proc = run_tool(['tools/test.py', osp.join(FIXTURE_CONFIGS, config), str(checkpoint),
                     '--work-dir', str(work_dir), *extra], cwd=cwd)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_train_then_test(family, toy_root, tmp_path):
    config, metric = FAMILIES[family]
    work = tmp_path / 'work'
    train(config, work, toy_root)
    losses = train_losses(work)
    assert len(losses) == 12
    assert sum(losses[-3:]) < sum(losses[:3]), f'loss did not go down: {losses}'
    log = evaluate(config, work / 'iter_12.pth', tmp_path / 'test', toy_root)
    assert metric in log


def test_resume_continues_from_checkpoint(toy_root, tmp_path):
    config = 'ca_pvt_fpn_tiny.py'
    work = tmp_path / 'work'
    train(config, work, toy_root, '--cfg-options', 'train_cfg.max_iters=6')
    assert (work / 'iter_6.pth').is_file()
    proc = train(config, work, toy_root, '--resume', str(work / 'iter_6.pth'))
    assert 'resumed epoch: 0, iter: 6' in proc.stdout + proc.stderr
    assert (work / 'iter_12.pth').is_file()


def test_distributed_training_on_two_processes(toy_root, tmp_path):
    work = tmp_path / 'dist'
    proc = run_tool(['tools/dist_train.sh', osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py'),
                     '2', '--work-dir', str(work), '--cfg-options', 'train_cfg.max_iters=4',
                     'train_cfg.val_interval=4'], cwd=toy_root, env={'PORT': '29531'})
    log = proc.stdout + proc.stderr
    assert 'process rank 1 of world size 2' in log
    assert 'coco/bbox_mAP' in log and (work / 'iter_4.pth').is_file()


def test_core_count_changed_at_test_time(toy_root, tmp_path):
    config = 'core_pvt_cls_tiny.py'
    work = tmp_path / 'work'
    train(config, work, toy_root, '--cfg-options', 'train_cfg.max_iters=2',
          'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2')
    default = evaluate(config, work / 'iter_2.pth', tmp_path / 't8', toy_root)
    assert 'testing with 8 active cores' in default
    elastic = evaluate(config, work / 'iter_2.pth', tmp_path / 't2', toy_root,
                   '--cfg-options', 'model.backbone.num_cores=2')
    assert 'testing with 2 active cores' in elastic and 'accuracy/top1' in elastic
