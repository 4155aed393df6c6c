"""Circulant attention on the CUDA layout (MMCIRC_LAYOUT=cuda, run on CPU tensors):
exact against the dense reference, one batched transform, a fixed operator count, no
round trip of the spectrum under bf16; and the per-shape plan of the module."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dense_reference import circulant_attention_dense, circulant_module_dense
from mmcirc.benchmark.suites.launches import count_ops
from mmcirc.ops import CirculantAttention, circulant, circulant_attention
from mmcirc.ops.settings import forced_layout

BOUNDARIES = ['circular', 'zero']


class _MatmulDtypes(TorchDispatchMode):
    """Records the dtypes of the matrix products' operands, in call order."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ('bmm', 'baddbmm', 'mm', 'addmm'):
            self.seen.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
        return func(*args, **(kwargs or {}))


def _ops(m, x, hw, layout='cuda'):
    """Compute ops of one no-grad forward by name (the benchmark's dispatch counter)."""
    with forced_layout(layout), torch.no_grad():
        return count_ops(m, x, hw)[1]


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('num_heads', [None, 2])
def test_functional_matches_dense_float64(boundary, num_heads):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    with forced_layout('cuda'):
        out = circulant_attention(q, k, v, boundary=boundary, num_heads=num_heads)
    ref = circulant_attention_dense(q, k, v, boundary, num_heads)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('num_heads', [None, 2])
def test_module_matches_dense_float64(boundary, num_heads):
    torch.manual_seed(0)
    m = CirculantAttention(4, num_heads=num_heads, boundary=boundary).double()
    x = torch.randn(2, 20, 4, dtype=torch.float64)
    with forced_layout('cuda'):
        y = m(x, (4, 5))
    torch.testing.assert_close(y, circulant_module_dense(m, x, (4, 5)), rtol=1e-10, atol=1e-12)


def test_one_batched_transform_over_all_heads(monkeypatch):
    """The CUDA layout ignores the CPU's cache budget: one qkv product, one forward
    transform of x, whatever BLOCK_BYTES says."""
    monkeypatch.setattr(circulant, 'BLOCK_BYTES', 1)  # one head per block on the CPU
    m = CirculantAttention(8)
    for layout, products in (('cuda', 1), ('cpu', 8)):
        assert _ops(m, torch.randn(1, 30, 8), (5, 6), layout)['bmm'] == products


def test_operator_count_does_not_grow_with_the_map():
    m = CirculantAttention(8).eval()
    small, large = (_ops(m, torch.randn(2, h * w, 8), (h, w)) for h, w in ((4, 4), (64, 64)))
    assert small == large


def test_default_scale_costs_no_operation():
    """d = 1, 'sqrt_n' on the circular grid: the FFTs' normalisations carry s, so the
    only products are Eq. 15's, Eq. 16's and the gate's."""
    m = CirculantAttention(8).eval()
    assert _ops(m, torch.randn(1, 30, 8), (5, 6))['mul'] == 3


def test_bf16_keeps_the_spectrum_in_float32():
    """Under autocast the qkv product on the spectrum runs in float32 in the CUDA
    layout: no cast of the spectrum to bf16 and back; gate and proj run in bf16."""
    m = CirculantAttention(4)
    with forced_layout('cuda'), torch.autocast('cpu', dtype=torch.bfloat16), _MatmulDtypes() as mm:
        y = m(torch.randn(1, 30, 4), (5, 6))
    assert y.dtype == torch.bfloat16
    assert mm.seen[1] == {torch.float32}  # gate, qkv, proj in call order
    assert mm.seen[0] == mm.seen[2] == {torch.bfloat16}


def test_plan_made_once_per_shape(monkeypatch):
    m = CirculantAttention(4).eval()
    made = []
    plan = CirculantAttention._new_plan
    monkeypatch.setattr(
        CirculantAttention, '_new_plan', lambda s, *a: made.append(1) or plan(s, *a)
    )
    with torch.no_grad():
        for hw in ((5, 6), (5, 6), (6, 5), (5, 6)):
            m(torch.randn(1, 30, 4), hw)
    assert len(made) == 2


def test_plan_checks_still_refuse_bad_input_once_cached():
    m = CirculantAttention(4).eval()
    with torch.no_grad():
        m(torch.randn(1, 30, 4), (5, 6))
        with pytest.raises(ValueError, match='hw_shape=\\(5, 7\\) gives H\\*W=35'):
            m(torch.randn(1, 30, 4), (5, 7))
