"""ca_deit.py and veca.py need torch alone: in a process where the OpenMMLab packages
cannot be imported, ``mmcirc.models.backbones`` offers them and they run a forward."""

import os.path as osp

from helpers import REPO, run_torch_only, torch_only_origin

SCRIPT = r"""
import torch
from mmcirc.models.backbones import CADeiT, VECAViT
a = CADeiT(arch=dict(embed_dims=8, depth=1), patch_size=8, init_cfg=None)
a.init_weights()
v = VECAViT(arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_ratio=2.0, num_cores=8), patch_size=8)
v.init_weights()
x = torch.randn(1, 3, 24, 40)
print(tuple(a(x)[0].shape), tuple(v(x)[0].shape))
"""


def test_models_import_with_torch_only():
    proc = run_torch_only(code=SCRIPT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[0] == '(1, 8, 3, 5) (1, 16, 3, 5)'
    assert torch_only_origin(proc) == dict(mmcirc=osp.join(REPO, 'mmcirc', '__init__.py'), mm=[])
