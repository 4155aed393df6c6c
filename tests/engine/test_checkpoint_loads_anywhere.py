"""A checkpoint that mmcirc's configs write (SafeCheckpointIOHook in default_hooks) loads
wherever a checkpoint is loaded, with no call a user must know of: in a fresh interpreter
that has not imported mmcirc, plain ``torch.load`` (torch's default ``weights_only``),
mmdet's ``init_detector`` + ``inference_detector`` and ``DetInferencer``, mmseg's
``init_model`` + ``inference_model`` and ``MMSegInferencer``. The reference for the
weights is the checkpoint's own ``state_dict``, read with ``weights_only=True``."""

import glob
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config
from mmengine.runner import Runner

from helpers import FIXTURE_CONFIGS, REPO

pytestmark = pytest.mark.usefixtures('mmengine_own_io', 'one_torch_thread')

DET = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')
SEG = osp.join(FIXTURE_CONFIGS, 'ca_pvt_fpn_tiny.py')

# Runs in a fresh interpreter: argv = det config, det checkpoint, seg config, seg
# checkpoint, det image, seg image. Prints one JSON line.
LOAD_EVERYWHERE = r"""
import json, sys
import torch

det_cfg, det_ckpt, seg_cfg, seg_ckpt, det_img, seg_img = sys.argv[1:]
out = {}
plain = {p: torch.load(p) for p in (det_ckpt, seg_ckpt)}  # torch's default: weights_only
out['torch_load'] = {p: sorted(c) for p, c in plain.items()}
out['mmcirc_before_libraries'] = 'mmcirc' in sys.modules


def same_weights(model, ckpt):
    theirs = plain[ckpt]['state_dict']
    ours = model.state_dict()
    return sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


from mmdet.apis import DetInferencer, inference_detector, init_detector

model = init_detector(det_cfg, det_ckpt, device='cpu')
result = inference_detector(model, det_img)
out['init_detector'] = [same_weights(model, det_ckpt), len(result.pred_instances) > 0]
inferencer = DetInferencer(det_cfg, det_ckpt, device='cpu', show_progress=False)
preds = inferencer(det_img, no_save_vis=True)['predictions']
out['DetInferencer'] = [same_weights(inferencer.model, det_ckpt), len(preds[0]['labels']) > 0]

from mmseg.apis import MMSegInferencer, inference_model, init_model

model = init_model(seg_cfg, seg_ckpt, device='cpu')
result = inference_model(model, seg_img)
out['init_model'] = [same_weights(model, seg_ckpt), tuple(result.pred_sem_seg.data.shape[-2:])]
inferencer = MMSegInferencer(seg_cfg, seg_ckpt, device='cpu')
preds = inferencer(seg_img)['predictions']
out['MMSegInferencer'] = [same_weights(inferencer.model, seg_ckpt), tuple(preds.shape)]

from mmengine.runner import checkpoint as mmengine_checkpoint

# nothing swapped mmengine's own loader in: the files loaded as any checkpoint does
out['mmengine_loader'] = mmengine_checkpoint.CheckpointLoader._schemes[''] is (
    mmengine_checkpoint.load_from_local
)
print(json.dumps(out))
"""


def _train_two_iterations(config, work_dir):
    cfg = Config.fromfile(config)
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = osp.basename(str(work_dir))
    cfg.train_cfg.max_iters = 2
    cfg.train_cfg.val_interval = 100
    cfg.default_hooks.checkpoint.interval = 2
    cfg.log_level = 'WARNING'
    Runner.from_cfg(cfg).train()
    return str(work_dir / 'iter_2.pth')


def test_a_trained_checkpoint_loads_through_torch_mmdet_and_mmseg(toy_root, tmp_path, monkeypatch):
    monkeypatch.chdir(toy_root)  # the configs name data/ relative to it
    det = _train_two_iterations(DET, tmp_path / 'det')
    seg = _train_two_iterations(SEG, tmp_path / 'seg')
    det_img = sorted(glob.glob(str(toy_root / 'data/toy_coco/val2017/*.jpg')))[0]
    seg_img = sorted(
        glob.glob(str(toy_root / 'data/toy_ade/ADEChallengeData2016/images/validation/*.jpg'))
    )[0]
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, '-c', LOAD_EVERYWHERE, DET, det, SEG, seg, det_img, seg_img],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for ckpt in (det, seg):
        assert {'meta', 'state_dict', 'message_hub', 'optimizer'} <= set(out['torch_load'][ckpt])
    assert out['mmcirc_before_libraries'] is False
    assert out['init_detector'] == [True, True]
    assert out['DetInferencer'] == [True, True]
    assert out['init_model'] == [True, [128, 128]]  # the generated ADE-format images' size
    assert out['MMSegInferencer'] == [True, [128, 128]]
    assert out['mmengine_loader'] is True
