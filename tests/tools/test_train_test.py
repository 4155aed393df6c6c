"""tools/train.py and tools/test.py end to end on the toy COCO data (mmdet's RetinaNet);
refusals through the commands' main in this process.

Iterations and metrics are read from the JSON files mmengine writes (vis_data/scalars.json,
<timestamp>.json) and from the checkpoints' meta; the log only where nothing else shows it.
"""

import argparse
import os.path as osp

import pytest
import torch

from helpers import (
    FIXTURE_CONFIGS,
    assert_metric,
    command_state_kept,
    evaluated_metrics,
    run_dirs,
    run_tool,
    train_iters,
)
from mmcirc.cli.test import main as main_test
from mmcirc.cli.train import main as main_train

CONFIG = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')


def test_train_stop_resume_continue_test(toy_root, tmp_path):
    work = tmp_path / 'work'
    run_tool(
        [
            'tools/train.py',
            CONFIG,
            '--work-dir',
            str(work),
            '--cfg-options',
            'train_cfg.max_iters=2',
            'train_cfg.val_interval=100',
        ],
        cwd=toy_root,
    )
    assert (work / 'iter_2.pth').is_file() and not (work / 'iter_4.pth').exists()

    run_tool(
        ['tools/train.py', CONFIG, '--work-dir', str(work), '--resume', str(work / 'iter_2.pth')],
        cwd=toy_root,
    )
    assert len(run_dirs(work)) == 2
    assert train_iters(work, 0) == [1, 2]
    assert train_iters(work, 1) == [3, 4], 'the resumed run did not continue at iteration 3'
    assert (work / 'iter_4.pth').is_file()
    assert torch.load(work / 'iter_4.pth', weights_only=False)['meta']['iter'] == 4

    out = tmp_path / 'results.pkl'
    run_tool(
        [
            'tools/test.py',
            CONFIG,
            str(work / 'iter_4.pth'),
            '--work-dir',
            str(tmp_path / 'test'),
            '--out',
            str(out),
            '--show-dir',
            'vis',
        ],
        cwd=toy_root,
    )
    assert_metric(evaluated_metrics(tmp_path / 'test'), 'coco/bbox_mAP', 1)
    assert out.is_file()
    assert list((tmp_path / 'test').glob('*/vis/*.jpg')), 'no painted predictions'


@pytest.fixture
def in_process(run_main):
    """``in_process(main, args, cwd)``: :func:`run_main` in
    :func:`~helpers.command_state_kept`."""

    def run(main, args, cwd):
        with command_state_kept():
            return run_main(main, args, cwd)

    return run


def test_checkpoint_with_foreign_object_is_refused(toy_root, tmp_path, in_process):
    ckpt = tmp_path / 'foreign.pth'
    torch.save({'state_dict': {}, 'meta': argparse.Namespace(evil=True)}, ckpt)
    proc = in_process(main_test, [CONFIG, str(ckpt), '--work-dir', str(tmp_path / 'w')], toy_root)
    assert proc.returncode == 1
    assert 'refused: it would run code' in proc.stderr and 'argparse.Namespace' in proc.stderr
    assert 'Traceback' not in proc.stderr


def test_missing_config_is_one_line_error(tmp_path, in_process):
    proc = in_process(main_train, [str(tmp_path / 'nope.py')], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f'error: config file not found: {tmp_path / "nope.py"}'
    ]


def test_unknown_backbone_is_one_line_error(toy_root, tmp_path, in_process):
    cfg = tmp_path / 'bad.py'
    cfg.write_text(
        f"_base_ = '{CONFIG}'\nmodel = dict(backbone=dict(_delete_=True, type='NoSuchNet'))\n"
    )
    proc = in_process(main_train, [str(cfg), '--work-dir', str(tmp_path / 'w')], toy_root)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith('error:')]
    assert len(lines) == 1 and 'NoSuchNet is not in the mmdet::model registry' in lines[0]
    assert 'Traceback' not in proc.stderr
