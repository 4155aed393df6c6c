"""The Triton kernel of circulant attention's core (``mmcirc::circulant_core``) in Triton's
interpreter on CPU tensors, against the dense float64 references of
``tests/ops/dense_reference.py``.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined (``triton.jit`` makes an
``InterpretedFunction`` then), so the fixture ``triton_interpreter`` (tests/conftest.py)
sets it before the kernels' module is first imported (and re-imports it if it was imported
without). Tolerances, relative to the
largest value of the reference: float32 inputs 5e-6 forward, 1e-5 gradients (the kernel's
DFTs are float32 matrix products; measured at most about 1e-6, the torch.fft path's
about 5e-7); bfloat16 inputs 2^-7, one bfloat16 step at the top of the output's range
(the interpreter casts float32 to bfloat16 by truncation, where a GPU and torch round to
nearest, half a step: measured 4.6e-3 here, the torch.fft path's 2.0e-3).
About 40 s of the suite on two cores.
"""

import copy

import pytest
import torch

from dense_reference import circulant_attention_dense, circulant_module_dense
from mmcirc.benchmark.suites.launches import count_ops
from mmcirc.ops import CirculantAttention, circulant_attention
from mmcirc.ops.circulant import scale_value
from mmcirc.ops.circulant_kernel import circulant_core

SIZES = [(7, 9), (14, 14), (16, 16), (8, 32)]
CASES = [(hw, b, d) for hw in SIZES for b in ('circular', 'zero') for d in (1, 8)]


pytestmark = pytest.mark.usefixtures('triton_interpreter')


def _maps(hw, d, dtype=torch.float64, seed=0):
    """q, k, v (2, H, W, C) float64 with heads of d channels (C = 8 for d = 1, else 2d)."""
    g = torch.Generator().manual_seed(seed)
    c = 8 if d == 1 else 2 * d
    return [torch.randn(2, *hw, c, generator=g, dtype=torch.float64).to(dtype) for _ in range(3)]


def _core(q, k, v, boundary, d):
    b, h, w, c = q.shape
    tokens = [t.reshape(b, h * w, c) for t in (q, k, v)]
    s = scale_value('sqrt_n', h * w, d)
    return circulant_core(*tokens, None, h, w, c // d, boundary == 'zero', s).view(q.shape)


def _err(a, ref):
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize('hw, boundary, d', CASES)
def test_forward_equals_dense_float64(hw, boundary, d):
    q, k, v = _maps(hw, d)
    ref = circulant_attention_dense(q, k, v, boundary=boundary, num_heads=q.shape[-1] // d)
    out = _core(*(t.float() for t in (q, k, v)), boundary, d)
    assert out.dtype == torch.float32
    assert _err(out, ref) < 5e-6


@pytest.mark.parametrize('hw, boundary, d', CASES)
def test_gradients_equal_dense_float64(hw, boundary, d):
    q, k, v = (t.requires_grad_() for t in _maps(hw, d))
    ref = circulant_attention_dense(q, k, v, boundary=boundary, num_heads=q.shape[-1] // d)
    dy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = torch.autograd.grad(ref, (q, k, v), dy)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    got = torch.autograd.grad(_core(q32, k32, v32, boundary, d), (q32, k32, v32), dy.float())
    for g, e in zip(got, expected):
        assert _err(g, e) < 1e-5


@pytest.mark.parametrize('boundary', ['circular', 'zero'])
def test_bfloat16_inputs_within_one_output_step(boundary):
    q, k, v = _maps((14, 14), 1, torch.bfloat16)
    ref = circulant_attention_dense(*(t.double() for t in (q, k, v)), boundary=boundary)
    out = _core(q, k, v, boundary, 1)
    assert out.dtype == torch.bfloat16
    assert _err(out, ref) < 2**-7


@pytest.mark.parametrize('hw, boundary, heads', [((7, 9), 'circular', None), ((8, 16), 'zero', 2)])
def test_layer_with_kernel_equals_dense_module(hw, boundary, heads):
    """The layer's kernel path (gate, qkv, core, projection) in inference (one packed
    linear) and with gradients (two linears) against the dense module in float64."""
    torch.manual_seed(0)
    m = CirculantAttention(16, num_heads=heads, boundary=boundary, kernel='triton')
    x = torch.randn(2, hw[0] * hw[1], 16)
    ref = circulant_module_dense(copy.deepcopy(m).double(), x.double(), hw)
    assert m._plan(x, hw).core is not None  # the kernel runs the core
    with torch.no_grad():
        assert _err(m(x, hw), ref) < 5e-6
    xg = x.clone().requires_grad_()
    m(xg, hw).square().sum().backward()
    md = copy.deepcopy(m).double()
    md.zero_grad()
    xd = x.double().requires_grad_()
    circulant_module_dense(md, xd, hw).square().sum().backward()
    for got, expected in zip((xg, *m.parameters()), (xd, *md.parameters())):
        assert _err(got.grad, expected.grad) < 1e-5


def test_layer_counts_one_operator_for_the_core():
    """In inference (eval mode packs the qkv and gate weights into one linear)."""
    m = CirculantAttention(8, kernel='triton').eval()
    with torch.no_grad():
        _, ops = count_ops(m, torch.randn(1, 16, 8), (4, 4))
    assert dict(ops) == {'addmm': 2, 'circulant_core': 1}  # qkv + gate, core, projection


def test_opcheck_fake_and_autograd_registrations():
    q, k, v, g = (torch.randn(2, 63, 4) for _ in range(4))
    torch.library.opcheck(circulant_core, (q, k, v, g, 7, 9, 2, True, 0.1, 'ieee'))


@pytest.mark.parametrize(
    'hw, boundary, dtype, runs',
    [
        ((64, 64), 'circular', torch.float32, True),
        ((64, 65), 'circular', torch.float32, False),
        ((32, 32), 'zero', torch.bfloat16, True),
        ((33, 8), 'zero', torch.float32, False),
        ((8, 8), 'circular', torch.float64, False),
    ],
)
def test_maps_beyond_the_limit_take_the_torch_path(hw, boundary, dtype, runs):
    m = CirculantAttention(4, boundary=boundary, kernel='triton')
    x = torch.zeros(1, hw[0] * hw[1], 4, dtype=dtype)
    assert (m._plan(x, hw).core is not None) is runs


def test_unknown_kernel_is_a_value_error_naming_it():
    with pytest.raises(
        ValueError, match=r"^kernel must be one of \('torch', 'triton'\), got 'cuda'$"
    ):
        CirculantAttention(8, kernel='cuda')


def test_functional_form_is_the_reference_path():
    """The functional form stays on torch.fft (no kernel switch): the kernel equals it."""
    q, k, v = (t.float() for t in _maps((7, 9), 1))
    assert _err(_core(q, k, v, 'zero', 1), circulant_attention(q, k, v, boundary='zero')) < 5e-6


def test_layer_compiles_to_one_graph_and_exports_one_core():
    torch.manual_seed(0)
    m = CirculantAttention(8, kernel='triton').eval()
    x = torch.randn(1, 16, 8)
    compiled = torch.compile(lambda t: m(t, (4, 4)), backend='aot_eager', fullgraph=True)
    with torch.no_grad():
        assert _err(compiled(x), m(x, (4, 4)).double()) < 1e-6
    ep = torch.export.export(_Tokens(m, (4, 4)), (x,), strict=False)
    calls = [str(n.target) for n in ep.graph.nodes if n.op == 'call_function']
    assert calls.count('mmcirc.circulant_core.default') == 1 and 'aten.fft' not in str(calls)


class _Tokens(torch.nn.Module):
    def __init__(self, layer, hw):
        super().__init__()
        self.layer, self.hw = layer, hw

    def forward(self, x):
        return self.layer(x, self.hw)
