"""Backward of whole backbones on row bands: CA-PVT-T all-circulant and Core-PVT-T
all-core (the backbones of configs/ca_pvt_t-allcirc_fpn_80k_ade20k.py and
configs/core_pvt_t-allcore_fpn_80k_ade20k.py, made tiny, random weights, no stochastic
depth) in training mode, float64, on 2 and 3 gloo ranks against one process.

Each rank runs the backbone's own forward on its band of the image (BandedMap, the
attention operators sharded) and ``backward`` on its part of L = sum over the four
feature maps of sum(map * fixed random weights); every parameter's gradient summed over
the ranks must equal autograd of the single-process backbone on the whole image within
1e-9 relative. The image rows (160 -> 40, 20, 10, 5 per stage) leave every rank rows
of every map at P = 3. One run_parallel call per world size runs both backbones."""

import os.path as osp

import pytest
import torch

from helpers import REPO
from mmcirc.distributed import BandedMap, run_parallel
from mmcirc.distributed.banded_map import shard_operators
from mmcirc.distributed.handlers import circulant, core  # noqa: F401  (register the handlers)

CONFIGS = {
    'ca_pvt_t_allcirc': 'ca_pvt_t-allcirc_fpn_80k_ade20k.py',
    'core_pvt_t_allcore': 'core_pvt_t-allcore_fpn_80k_ade20k.py',
}
ARCH = dict(embed_dims=[16, 32, 40, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 5, 8])
IMAGE = (1, 3, 160, 72)
REL = 1e-9


def _backbone(name):
    """The config's backbone, tiny, float64, training mode, seeded random weights."""
    import mmcirc  # noqa: F401  (registers the backbones)
    from mmcirc.apis.builder import load_model_config
    from mmseg.registry import MODELS

    cfg = load_model_config(osp.join(REPO, 'configs', CONFIGS[name])).model.backbone
    cfg.update(init_cfg=None, arch=ARCH, drop_path_rate=0.0)
    torch.manual_seed(0)
    bb = MODELS.build(cfg.to_dict())
    for p in bb.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return bb.double().train()


def _image_and_weights(outs):
    torch.manual_seed(1)
    img = torch.randn(IMAGE, dtype=torch.float64)
    return img, [torch.randn(o.shape, dtype=torch.float64) for o in outs]


def _grads(bb):
    return {n: p.grad for n, p in bb.named_parameters()}


@pytest.fixture(scope='module')
def references():
    """name -> (the single-process backbone, its output shapes, its parameter grads)."""
    out = {}
    for name in CONFIGS:
        bb = _backbone(name)
        torch.manual_seed(1)
        img = torch.randn(IMAGE, dtype=torch.float64)
        feats = bb(img)
        _, weights = _image_and_weights(feats)
        sum((f * w).sum() for f, w in zip(feats, weights)).backward()
        out[name] = (bb, [f.shape for f in feats], _grads(bb))
    return out


def _worker(references):
    out = {}
    for name, (bb, shapes, _) in references.items():
        bb.zero_grad(set_to_none=True)
        shard_operators(bb)
        img, weights = _image_and_weights([torch.empty(s) for s in shapes])
        feats = bb(BandedMap.scatter(img))
        loss = sum((f.local * f.cut(w, f.band_dim)).sum() for f, w in zip(feats, weights))
        loss.backward()
        out[name] = _grads(bb)
    return out


@pytest.fixture(scope='module', params=[2, 3], ids=['P2', 'P3'])
def ranks(request, references):
    return run_parallel(_worker, request.param, args=(references,), start_method='forkserver')


@pytest.mark.parametrize('name', list(CONFIGS))
def test_parameter_gradients_summed_equal_single_process(ranks, references, name):
    """Every parameter's gradient, summed over the ranks, equals one process's within
    1e-9 relative (to the largest entry of that gradient)."""
    bb, _, want = references[name]
    assert len(want) == len(list(bb.parameters()))
    for n, ref in want.items():
        got = [r[name][n] for r in ranks]
        assert (ref is None) == all(g is None for g in got), n
        if ref is None:
            continue
        got = sum(g for g in got if g is not None)
        scale = float(ref.abs().max()) or 1.0
        torch.testing.assert_close(
            got, ref, rtol=REL, atol=REL * scale, msg=lambda s, n=n: f'{n}: {s}'
        )
