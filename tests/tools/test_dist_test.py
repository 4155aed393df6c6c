"""tools/dist_test.sh: 2 processes evaluate one checkpoint and exit 0 (gloo, CPU)."""

import json
import math
import os.path as osp

from helpers import FIXTURE_CONFIGS, run_tool

CONFIG = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')


def test_distributed_test_two_processes(toy_root, tmp_path):
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
    proc = run_tool(
        [
            'tools/dist_test.sh',
            CONFIG,
            str(work / 'iter_2.pth'),
            '2',
            '--work-dir',
            str(tmp_path / 'test'),
        ],
        cwd=toy_root,
        env={'PORT': '29541'},
    )
    assert proc.returncode == 0
    log = proc.stdout + proc.stderr
    assert 'process rank 0 of world size 2' in log and 'process rank 1 of world size 2' in log
    (metrics,) = (tmp_path / 'test').glob('*/*.json')
    value = json.loads(metrics.read_text())['coco/bbox_mAP']
    assert math.isfinite(value) and 0.0 <= value <= 1.0
