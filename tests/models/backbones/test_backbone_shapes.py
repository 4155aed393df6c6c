"""Output shapes of the CA/Core pyramids on any input size, forward and backward."""

import math

import pytest
import torch

from mmcirc.models.backbones import CAPVT, CASwin

PVT_TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4))
SWIN_TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 2, 1), num_heads=(1, 2, 3, 4))
LAYOUTS = {
    'circulant': 'circulant',
    'core': 'core',
    'mixed': None,  # paper layout: stages 1-2 replaced, 3-4 original
    'mixed_core': ('core', 'circulant', None, 'core'),  # None -> family original
}
SIZES = [(64, 64), (113, 257), (33, 47)]


def expected_hw(h, w):
    """Non-overlapping 4-2-2-2 downsampling with bottom/right padding."""
    sizes = []
    h, w = math.ceil(h / 4), math.ceil(w / 4)
    for _ in range(4):
        sizes.append((h, w))
        h, w = math.ceil(h / 2), math.ceil(w / 2)
    return sizes


def build(family, layout, **kwargs):
    cls, arch, orig = (CAPVT, PVT_TINY, 'sra') if family == 'pvt' else (CASwin, SWIN_TINY, 'window')
    stage_attentions = LAYOUTS[layout]
    if isinstance(stage_attentions, tuple):
        stage_attentions = tuple(orig if a is None else a for a in stage_attentions)
    model = cls(arch=arch, stage_attentions=stage_attentions, num_cores_max=8, **kwargs)
    model.init_weights()
    return model


@pytest.mark.parametrize('size', SIZES, ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('layout', list(LAYOUTS))
@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_output_shapes_and_backward(family, layout, size):
    torch.manual_seed(0)
    model = build(family, layout)
    x = torch.randn(2, 3, *size, requires_grad=True)
    outs = model(x)
    assert isinstance(outs, tuple) and len(outs) == 4
    for out, width, hw in zip(outs, (8, 16, 24, 32), expected_hw(*size)):
        assert out.shape == (2, width, *hw)
        assert torch.isfinite(out).all()
    sum(o.square().mean() for o in outs).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f'parameters without gradient: {missing}'


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_tiny_input(family):
    model = build(family, 'mixed').eval()
    outs = model(torch.randn(1, 3, 33, 33))
    assert [tuple(o.shape[-2:]) for o in outs] == expected_hw(33, 33)


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_out_indices_select_stages(family):
    model = build(family, 'mixed', out_indices=(3, 1)).eval()
    outs = model(torch.randn(1, 3, 64, 96))
    assert [o.shape[1] for o in outs] == [16, 32]
    model = build(family, 'mixed', out_indices=-1).eval()
    assert [o.shape[1] for o in model(torch.randn(1, 3, 64, 96))] == [32]


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_batch_elements_are_independent(family):
    """No mixing across the batch (core banks are expanded, not shared state)."""
    torch.manual_seed(0)
    model = build(family, 'mixed_core').eval()
    x = torch.randn(3, 3, 40, 56)
    full = model(x)
    single = model(x[1:2])
    for a, b in zip(full, single):
        torch.testing.assert_close(a[1:2], b, rtol=1e-4, atol=1e-5)
