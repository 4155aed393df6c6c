"""ca_deit.py and veca.py need torch alone: in a process where the OpenMMLab packages
cannot be imported they load (without running the package __init__ files, which
import the mmcv-based pyramids) and run a forward."""

import subprocess
import sys

from helpers import REPO

SCRIPT = r"""
import sys, types
for name in ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain'):
    sys.modules[name] = None  # importing any of them now fails
sys.path.insert(0, REPO)
import mmcirc  # the ops only, without mmengine
for pkg in ('mmcirc.models', 'mmcirc.models.backbones'):
    mod = types.ModuleType(pkg)
    mod.__path__ = [REPO + '/' + pkg.replace('.', '/')]
    sys.modules[pkg] = mod
import torch
from mmcirc.models.backbones.ca_deit import CADeiT
from mmcirc.models.backbones.veca import VECAViT
a = CADeiT(arch=dict(embed_dims=8, depth=1), patch_size=8, init_cfg=None)
a.init_weights()
v = VECAViT(arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_ratio=2.0, num_cores=8), patch_size=8)
v.init_weights()
x = torch.randn(1, 3, 24, 40)
print(tuple(a(x)[0].shape), tuple(v(x)[0].shape))
"""


def test_models_import_with_torch_only():
    proc = subprocess.run(
        [sys.executable, '-c', f'REPO = {REPO!r}\n' + SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == '(1, 8, 3, 5) (1, 16, 3, 5)'
