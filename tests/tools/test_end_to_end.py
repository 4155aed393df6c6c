"""Each task family end to end on the generated data: tools/train.py a few iterations
(the loss goes down), then tools/test.py (its main, in this process) produces the task's
metric. Losses and metrics are read from the JSON files mmengine writes
(vis_data/scalars.json, <timestamp>.json), the active core count from the log
(<timestamp>.log).

The configs in tests/fixtures/configs inherit the real ones in configs/ and only shrink
widths, image sizes and schedules.
"""

import os.path as osp

import pytest

from helpers import (
    FIXTURE_CONFIGS,
    assert_metric,
    command_state_kept,
    evaluated_metrics,
    run_dirs,
    run_tool,
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
    """tools/test.py's main in this process (in ``cwd``); (its metrics from
    WORK_DIR/<timestamp>/<timestamp>.json, its log from <timestamp>.log)."""
    from mmcirc.cli.test import main

    args = [osp.join(FIXTURE_CONFIGS, config), str(checkpoint), '--work-dir', str(work_dir)]
    with command_state_kept(cwd):
        main([*args, *extra])
    (run,) = run_dirs(work_dir)
    with open(osp.join(run, osp.basename(run) + '.log')) as f:
        return evaluated_metrics(work_dir), f.read()


@pytest.fixture(scope='module')
def trained(toy_root, tmp_path_factory):
    """``trained(family)``: (work dir, metrics, log) of the family's config trained by
    tools/train.py (12 iterations) and its last checkpoint tested by tools/test.py, once
    for the module."""
    runs = {}

    def run(family):
        if family not in runs:
            config = FAMILIES[family][0]
            tmp = tmp_path_factory.mktemp(family)
            train(config, tmp / 'work', toy_root)
            runs[family] = (
                tmp / 'work',
                *evaluate(config, tmp / 'work' / 'iter_12.pth', tmp / 'test', toy_root),
            )
        return runs[family]

    return run


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_train_then_test(family, trained):
    _, metric, high = FAMILIES[family]
    work, metrics, _ = trained(family)
    losses = train_losses(work)
    assert len(losses) == 12
    assert sum(losses[-3:]) < sum(losses[:3]), f'loss did not go down: {losses}'
    assert_metric(metrics, metric, high)


def test_core_count_changed_at_test_time(trained, toy_root, tmp_path):
    config = FAMILIES['classification'][0]
    work, _, default = trained('classification')
    # the active core count is only in the log (NestedCoreHook)
    assert 'testing with 8 active cores' in default
    metrics, elastic = evaluate(
        config,
        work / 'iter_12.pth',
        tmp_path / 't2',
        toy_root,
        '--cfg-options',
        'model.backbone.num_cores=2',
    )
    assert 'testing with 2 active cores' in elastic
    assert_metric(metrics, 'accuracy/top1', 100)
