"""tools/train.py and tools/test.py end to end on the toy COCO data (mmdet's RetinaNet).

Iterations and metrics are read from the JSON files mmengine writes (vis_data/scalars.json,
<timestamp>.json) and from the checkpoints' meta; the log only where nothing else shows it.
"""

import argparse
import os.path as osp

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

    run_tool(['tools/train.py', CONFIG, '--work-dir', str(work), '--resume'], cwd=toy_root)
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


def test_checkpoint_with_foreign_object_is_refused(toy_root, tmp_path):
    ckpt = tmp_path / 'foreign.pth'
    torch.save({'state_dict': {}, 'meta': argparse.Namespace(evil=True)}, ckpt)
    proc = run_tool(
        ['tools/test.py', CONFIG, str(ckpt), '--work-dir', str(tmp_path / 'w')],
        cwd=toy_root,
        check=False,
    )
    assert proc.returncode == 1
    assert 'refused: it would run code' in proc.stderr and 'argparse.Namespace' in proc.stderr
    assert 'Traceback' not in proc.stderr


def test_distributed_training_two_processes(toy_root, tmp_path):
    work = tmp_path / 'dist'
    proc = run_tool(
        [
            'tools/dist_train.sh',
            CONFIG,
            '2',
            '--work-dir',
            str(work),
            '--cfg-options',
            'train_cfg.max_iters=2',
            'train_cfg.val_interval=2',
        ],
        cwd=toy_root,
        env={'PORT': '29517'},
    )
    log = proc.stdout + proc.stderr  # the process group is only in the log
    assert 'Distributed training: True' in log
    assert 'process rank 0 of world size 2' in log and 'process rank 1 of world size 2' in log
    assert (work / 'iter_2.pth').is_file() and train_iters(work) == [1, 2]
    (val,) = [r for r in train_scalars(work) if 'coco/bbox_mAP' in r]
    assert_metric(val, 'coco/bbox_mAP', 1)


def test_missing_config_is_one_line_error(tmp_path):
    proc = run_tool(['tools/train.py', str(tmp_path / 'nope.py')], cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f'error: config file not found: {tmp_path / "nope.py"}'
    ]


def test_unknown_backbone_is_one_line_error(toy_root, tmp_path):
    cfg = tmp_path / 'bad.py'
    cfg.write_text(
        f"_base_ = '{CONFIG}'\nmodel = dict(backbone=dict(_delete_=True, type='NoSuchNet'))\n"
    )
    proc = run_tool(
        ['tools/train.py', str(cfg), '--work-dir', str(tmp_path / 'w')], cwd=toy_root, check=False
    )
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith('error:')]
    assert len(lines) == 1 and 'NoSuchNet is not in the mmdet::model registry' in lines[0]
    assert 'Traceback' not in proc.stderr
