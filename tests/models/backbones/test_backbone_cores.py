"""Elastic core counts: C' really changes the work, never the output shapes."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mmcirc.models.backbones import CORE_PRESETS, CorePVT, CoreSwin
from mmcirc.ops.core import CoreAttention

TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 2, 1, 1), num_heads=(1, 2, 3, 4))
FAMILIES = [CorePVT, CoreSwin]


def flops(model, x):
    # with autograd on (forward FLOPs only are counted): under no_grad, torch's
    # ModuleTracker asserts on the core bank's views (requires_grad without a grad_fn)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x)
    return counter.get_total_flops()


def core_inputs(model, x):
    """C' seen by every CoreAttention call (the cores argument's second axis)."""
    seen = []
    hooks = [
        m.register_forward_hook(
            lambda mod, args, out: seen.append((args[1].shape[1], out[1].shape[1]))
        )
        for m in model.modules()
        if isinstance(m, CoreAttention)
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize('cls', FAMILIES)
def test_fewer_cores_fewer_flops_same_shapes(cls):
    torch.manual_seed(0)
    model = cls(arch=TINY, stage_attentions='core', num_cores_max=64).eval()
    model.init_weights()
    x = torch.randn(1, 3, 64, 64)
    counts, shapes = {}, {}
    for n in (64, 16, 4, 1):
        model.set_num_cores(n)
        counts[n] = flops(model, x)
        shapes[n] = [o.shape for o in model(x)]
    assert counts[64] > counts[16] > counts[4] > counts[1]
    assert all(shapes[n] == shapes[64] for n in shapes)


@pytest.mark.parametrize('cls', FAMILIES)
def test_only_the_prefix_of_the_bank_is_used(cls):
    model = cls(arch=TINY, num_cores=8, num_cores_max=32).eval()
    seen = core_inputs(model, torch.randn(2, 3, 40, 40))
    n_core_blocks = sum(d for d, a in zip(TINY['depths'], model.stage_attentions) if a == 'core')
    assert seen == [(8, 8)] * n_core_blocks
    model.set_num_cores(3)
    assert core_inputs(model, torch.randn(2, 3, 40, 40)) == [(3, 3)] * n_core_blocks


@pytest.mark.parametrize('cls', FAMILIES)
def test_output_depends_on_core_count(cls):
    torch.manual_seed(0)
    model = cls(arch=TINY, num_cores_max=16).eval()
    model.init_weights()
    x = torch.randn(1, 3, 48, 48)
    model.set_num_cores(16)
    full = model(x)
    model.set_num_cores(2)
    few = model(x)
    assert not torch.allclose(full[0], few[0])
    assert all(a.shape == b.shape for a, b in zip(full, few))


def test_unused_cores_get_no_gradient():
    model = CorePVT(arch=TINY, num_cores=4, num_cores_max=16)
    model.init_weights()
    sum(o.sum() for o in model(torch.randn(1, 3, 32, 32))).backward()
    bank = model.layers[0].cores
    assert bank.grad[:4].abs().sum() > 0
    assert bank.grad[4:].abs().sum() == 0


@pytest.mark.parametrize('preset', sorted(CORE_PRESETS))
def test_presets(preset):
    model = CoreSwin(arch=TINY, num_cores=preset)
    assert model.num_cores == CORE_PRESETS[preset]
    assert all(s.num_cores == CORE_PRESETS[preset] for s in model.stages if s.cores is not None)
    model.set_num_cores('mobile')
    assert model.num_cores == 8


def test_banks_per_core_stage():
    model = CoreSwin(
        arch=TINY, stage_attentions=('core', 'circulant', 'window', 'core'), num_cores_max=12
    )
    model.init_weights()
    banks = {i: s.cores for i, s in enumerate(model.stages) if s.cores is not None}
    assert sorted(banks) == [0, 3]
    assert banks[0].shape == (12, 8) and banks[3].shape == (12, 32)
    std = torch.cat([banks[0].flatten(), banks[3].flatten()]).std().item()
    assert 0.01 < std < 0.03
