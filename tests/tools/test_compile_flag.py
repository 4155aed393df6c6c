"""--compile in tools/train.py (mmengine's compile=) and tools/test.py (the test step),
with torch.compile's eager backend: the wiring, not inductor's code generation; on a
detection and a segmentation config with mmcirc backbones."""

import json
import math
import os.path as osp

import pytest

from helpers import FIXTURE_CONFIGS, run_tool

CONFIGS = {
    'detection': ('ca_pvt_retinanet_tiny.py', 'coco/bbox_mAP', 1.0),
    'segmentation': ('ca_pvt_fpn_tiny.py', 'mIoU', 100.0),
}


@pytest.mark.parametrize('task', list(CONFIGS))
def test_train_and_test_with_compile(task, toy_root, tmp_path):
    config, metric, top = CONFIGS[task]
    config = osp.join(FIXTURE_CONFIGS, config)
    work = tmp_path / 'work'
    proc = run_tool(
        [
            'tools/train.py',
            config,
            '--work-dir',
            str(work),
            '--compile',
            'eager',
            '--cfg-options',
            'train_cfg.max_iters=2',
            'train_cfg.val_interval=100',
            'default_hooks.checkpoint.interval=2',
        ],
        cwd=toy_root,
    )
    assert "compile = dict(backend='eager')" in proc.stdout + proc.stderr  # the config mmengine ran
    run_tool(
        [
            'tools/test.py',
            config,
            str(work / 'iter_2.pth'),
            '--work-dir',
            str(tmp_path / 'test'),
            '--compile',
            'eager',
        ],
        cwd=toy_root,
    )
    (metrics,) = (tmp_path / 'test').glob('*/*.json')
    value = json.loads(metrics.read_text())[metric]
    assert math.isfinite(value) and 0.0 <= value <= top
