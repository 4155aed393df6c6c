"""Each task family end to end on the generated data: tools/train.py a few iterations
(the loss goes down), then tools/test.py produces the task's metric. Losses and metrics
are read from the JSON files mmengine writes (vis_data/scalars.json, <timestamp>.json).

The configs in tests/fixtures/configs inherit the real ones in configs/ and only shrink
widths, image sizes and schedules.
"""

import os.path as osp

import pytest
import torch

from helpers import (
    FIXTURE_CONFIGS,
    assert_metric,
    evaluated_metrics,
    run_dirs,
    run_tool,
    train_iters,
    train_scalars,
)

FAMILIES = {  # config, its metric, the metric's upper bound (COCO: 1; mmseg, mmpretrain: %)
    'retinanet': ('ca_pvt_retinanet_tiny.py', 'coco/bbox_mAP', 1),
    'mask-rcnn': ('core_swin_mask-rcnn_tiny.py', 'coco/segm_mAP', 1),
    'upernet': ('ca_swin_upernet_tiny.py', 'mIoU', 100),
    'semantic-fpn': ('ca_pvt_fpn_tiny.py', 'mIoU', 100),
    'classification': ('core_pvt_cls_tiny.py', 'accuracy/top1', 100),
}


def train_losses(work_dir):
    """The per-iteration training losses mmengine logged to vis_data/scalars.json."""
    return [r['loss'] for r in train_scalars(work_dir) if 'loss' in r]


def train(config, work_dir, cwd, *extra):
    return run_tool(
        ['tools/train.py', osp.join(FIXTURE_CONFIGS, config), '--work-dir', str(work_dir), *extra],
        cwd=cwd,
    )


def evaluate(config, checkpoint, work_dir, cwd, *extra):
    """Run tools/test.py; (its metrics from WORK_DIR/<timestamp>/<timestamp>.json, its log)."""
    proc = run_tool(
        [
            'tools/test.py',
            osp.join(FIXTURE_CONFIGS, config),
            str(checkpoint),
            '--work-dir',
            str(work_dir),
            *extra,
        ],
        cwd=cwd,
    )
    return evaluated_metrics(work_dir), proc.stdout + proc.stderr


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_train_then_test(family, toy_root, tmp_path):
    config, metric, high = FAMILIES[family]
    work = tmp_path / 'work'
    train(config, work, toy_root)
    losses = train_losses(work)
    assert len(losses) == 12
    assert sum(losses[-3:]) < sum(losses[:3]), f'loss did not go down: {losses}'
    metrics, _ = evaluate(config, work / 'iter_12.pth', tmp_path / 'test', toy_root)
    assert_metric(metrics, metric, high)


def test_resume_continues_from_checkpoint(toy_root, tmp_path):
    config = 'ca_pvt_fpn_tiny.py'
    work = tmp_path / 'work'
    train(config, work, toy_root, '--cfg-options', 'train_cfg.max_iters=6')
    assert (work / 'iter_6.pth').is_file()
    train(config, work, toy_root, '--resume', str(work / 'iter_6.pth'))
    assert len(run_dirs(work)) == 2
    assert train_iters(work, 0) == list(range(1, 7))
    assert train_iters(work, 1) == list(range(7, 13)), 'the second run did not continue at 7'
    assert torch.load(work / 'iter_12.pth', weights_only=False)['meta']['iter'] == 12


def test_distributed_training_on_two_processes(toy_root, tmp_path):
    work = tmp_path / 'dist'
    proc = run_tool(
        [
            'tools/dist_train.sh',
            osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py'),
            '2',
            '--work-dir',
            str(work),
            '--cfg-options',
            'train_cfg.max_iters=4',
            'train_cfg.val_interval=4',
        ],
        cwd=toy_root,
        env={'PORT': '29531'},
    )
    assert 'process rank 1 of world size 2' in proc.stdout + proc.stderr  # only the log shows it
    (val,) = [r for r in train_scalars(work) if 'coco/bbox_mAP' in r]
    assert_metric(val, 'coco/bbox_mAP', 1)
    assert train_iters(work) == [1, 2, 3, 4] and (work / 'iter_4.pth').is_file()


def test_core_count_changed_at_test_time(toy_root, tmp_path):
    config = 'core_pvt_cls_tiny.py'
    work = tmp_path / 'work'
    train(
        config,
        work,
        toy_root,
        '--cfg-options',
        'train_cfg.max_iters=2',
        'train_cfg.val_interval=2',
        'default_hooks.checkpoint.interval=2',
    )
    # the active core count is only in the log (NestedCoreHook)
    _, default = evaluate(config, work / 'iter_2.pth', tmp_path / 't8', toy_root)
    assert 'testing with 8 active cores' in default
    metrics, elastic = evaluate(
        config,
        work / 'iter_2.pth',
        tmp_path / 't2',
        toy_root,
        '--cfg-options',
        'model.backbone.num_cores=2',
    )
    assert 'testing with 2 active cores' in elastic
    assert_metric(metrics, 'accuracy/top1', 100)
