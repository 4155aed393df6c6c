"""The export path of circulant attention (real matmul DFTs, ``export_mode``).

It must equal the default torch.fft path and the dense O(N^2) reference, in
float64, for both boundaries and any H x W, and run without complex tensors.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dense_reference import circulant_attention_dense, circulant_module_dense
from mmcirc.ops.circulant import CirculantAttention
from mmcirc.ops.circulant_functional import circulant_attention
from mmcirc.ops.settings import current, export_mode, switched

BOUNDARIES = ['circular', 'zero']
# square, non-square, odd, prime, single row/column, single token
SIZES = [(4, 4), (5, 7), (6, 9), (7, 11), (13, 1), (1, 6), (1, 1)]


def _maps(b, h, w, c, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, w, c, generator=g, dtype=dtype) for _ in range(3)]


def _module(boundary, num_heads, dim=4, scale='sqrt_n', seed=0):
    torch.manual_seed(seed)
    m = CirculantAttention(dim, num_heads=num_heads, boundary=boundary, scale=scale).double()
    with torch.no_grad():  # non-trivial gate/projection biases
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('hw', SIZES)
@pytest.mark.parametrize('num_heads', [None, 2])
def test_functional_export_path_equals_default_and_dense(boundary, hw, num_heads):
    q, k, v = _maps(2, *hw, 4)
    ref = circulant_attention(q, k, v, boundary=boundary, num_heads=num_heads)
    with export_mode():
        out = circulant_attention(q, k, v, boundary=boundary, num_heads=num_heads)
    assert out.shape == q.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    dense = circulant_attention_dense(q, k, v, boundary, num_heads)
    torch.testing.assert_close(out, dense, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('scale', ['n', 0.37])
def test_functional_export_path_scales(scale):
    q, k, v = _maps(1, 5, 6, 2)
    with export_mode():
        out = circulant_attention(q, k, v, boundary='zero', scale=scale)
    ref = circulant_attention_dense(q, k, v, 'zero', None, scale)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('hw', [(4, 4), (5, 7), (7, 3), (1, 5)])
@pytest.mark.parametrize('num_heads', [None, 2])
def test_module_export_path_equals_default_and_dense(boundary, hw, num_heads):
    m = _module(boundary, num_heads)
    x = torch.randn(2, hw[0] * hw[1], 4, dtype=torch.float64)
    ref = m(x, hw)
    with export_mode():
        out = m(x, hw)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out, circulant_module_dense(m, x, hw), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_module_export_path_float32(boundary):
    m = _module(boundary, None, dim=6)
    x = torch.randn(1, 8 * 5, 6, dtype=torch.float64)
    ref = circulant_module_dense(m, x, (8, 5))
    with export_mode():
        out = m.float()(x.float(), (8, 5))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_module_export_path_gradients_equal_default(boundary):
    m = _module(boundary, 2)
    x = torch.randn(2, 5 * 6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 5 * 6, 4, dtype=torch.float64)
    grads = []
    for enabled in (False, True):
        m.zero_grad()
        x.grad = None
        with export_mode(enabled):
            (m(x, (5, 6)) * w).sum().backward()
        grads.append([x.grad.clone()] + [p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-11)


class _RecordOps(TorchDispatchMode):
    """Names of the aten ops run and whether any produced a complex tensor."""

    def __init__(self):
        super().__init__()
        self.ops, self.complex = set(), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(func.overloadpacket.__name__)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_complex():
                self.complex = True
        return out


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_export_path_has_no_fft_and_no_complex(boundary):
    m = _module(boundary, None).float()
    x = torch.randn(1, 5 * 7, 4)
    with export_mode(), _RecordOps() as rec:
        m(x, (5, 7))
    assert not rec.complex
    assert not any('fft' in op for op in rec.ops), sorted(rec.ops)
    with _RecordOps() as rec:  # the default path is the torch.fft one
        m(x, (5, 7))
    assert rec.complex and any('fft' in op for op in rec.ops)


def test_export_mode_restores_previous_impl_on_error():
    assert current().fft_impl == 'torch'
    with pytest.raises(RuntimeError, match='boom'):
        with export_mode():
            assert current().fft_impl == 'dft'
            with export_mode(False):
                assert current().fft_impl == 'torch'
            assert current().fft_impl == 'dft'
            raise RuntimeError('boom')
    assert current().fft_impl == 'torch'


def test_unknown_fft_impl_refused():
    with pytest.raises(
        ValueError, match=r"^fft_impl must be one of \('torch', 'dft'\), got 'onnx'$"
    ):
        with switched(fft_impl='onnx'):
            pass
    assert current().fft_impl == 'torch'
