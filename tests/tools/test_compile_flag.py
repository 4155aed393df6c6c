"""--compile in tools/train.py (mmengine's compile=) and tools/test.py (the test step),
with torch.compile's eager backend: the wiring, not inductor's code generation."""

import json
import math
import os.path as osp

from helpers import FIXTURE_CONFIGS, run_tool

CONFIG = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')


def test_train_and_test_with_compile(toy_root, tmp_path):
    work = tmp_path / 'work'
    proc = run_tool(
        [
            'tools/train.py',
            CONFIG,
            '--work-dir',
            str(work),
            '--compile',
            'eager',
            '--cfg-options',
            'train_cfg.max_iters=2',
            'train_cfg.val_interval=100',
        ],
        cwd=toy_root,
    )
    assert "compile = dict(backend='eager')" in proc.stdout + proc.stderr  # the config mmengine ran
    run_tool(
        [
            'tools/test.py',
            CONFIG,
            str(work / 'iter_2.pth'),
            '--work-dir',
            str(tmp_path / 'test'),
            '--compile',
            'eager',
        ],
        cwd=toy_root,
    )
    (metrics,) = (tmp_path / 'test').glob('*/*.json')
    value = json.loads(metrics.read_text())['coco/bbox_mAP']
    assert math.isfinite(value) and 0.0 <= value <= 1.0
