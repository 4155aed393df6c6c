"""--compile in tools/train.py and tools/test.py: mmcirc's CompileBackboneHook (the
backbone and the neck compiled, fullgraph, the heads eager), on a detection and a
segmentation config with mmcirc backbones. The losses of a compiled training run are
the eager run's (``aot_eager``: dynamo's graphs and AOT autograd's backward run by eager
kernels, what was captured without inductor's code generation); the segmentation run
checks the wiring with the ``eager`` backend (dynamo alone)."""

import json
import math
import os.path as osp

import numpy as np

from helpers import FIXTURE_CONFIGS, run_tool, train_scalars

COMPILED = 'CompileBackboneHook: compiled the backbone and the neck'
RECOMPILED = 'new graph(s)'  # the hook's warning of a recompile after the first iteration


def _train(config, work, root, iters, *extra):
    return run_tool(
        [
            'tools/train.py',
            config,
            '--work-dir',
            str(work),
            *extra,
            '--cfg-options',
            f'train_cfg.max_iters={iters}',
            'train_cfg.val_interval=100',
            f'default_hooks.checkpoint.interval={iters}',
            'model.backbone.drop_path_rate=0.0',  # no random draws: eager and compiled alike
        ],
        cwd=root,
    )


def _losses(work):
    return [r['loss'] for r in train_scalars(work) if 'loss' in r]


def _test_metric(config, ckpt, work, root, metric):
    run_tool(
        ['tools/test.py', config, str(ckpt), '--work-dir', str(work), '--compile', 'eager'],
        cwd=root,
    )
    (metrics,) = work.glob('*/*.json')
    return json.loads(metrics.read_text())[metric]


def test_compiled_detection_training_has_the_eager_losses(toy_root, tmp_path):
    config = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')
    _train(config, tmp_path / 'eager', toy_root, 3)
    proc = _train(config, tmp_path / 'compiled', toy_root, 3, '--compile', 'aot_eager')
    log = proc.stdout + proc.stderr
    assert COMPILED in log and RECOMPILED not in log
    eager, compiled = _losses(tmp_path / 'eager'), _losses(tmp_path / 'compiled')
    assert len(eager) == 3 and len(set(eager)) == 3
    np.testing.assert_allclose(compiled, eager, rtol=1e-4)
    value = _test_metric(
        config, tmp_path / 'compiled' / 'iter_3.pth', tmp_path / 'test', toy_root, 'coco/bbox_mAP'
    )
    assert math.isfinite(value) and 0.0 <= value <= 1.0


def test_segmentation_trains_and_tests_compiled(toy_root, tmp_path):
    config = osp.join(FIXTURE_CONFIGS, 'ca_pvt_fpn_tiny.py')
    proc = _train(config, tmp_path / 'work', toy_root, 2, '--compile', 'eager')
    assert COMPILED in proc.stdout + proc.stderr
    value = _test_metric(
        config, tmp_path / 'work' / 'iter_2.pth', tmp_path / 'test', toy_root, 'mIoU'
    )
    assert math.isfinite(value) and 0.0 <= value <= 100.0
