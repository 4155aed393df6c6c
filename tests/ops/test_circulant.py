"""Circulant attention against the dense O(N^2) reference (tests/ops)."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dense_reference import circulant_attention_dense, circulant_module_dense, offset_index
from mmcirc.ops import (
    CirculantAttention,
    circulant,
    circulant_attention,
    circulant_transforms,
    fft_grid,
    next_fast_len,
)

BOUNDARIES = ['circular', 'zero']
SIZES = [(4, 4), (5, 7), (3, 3), (7, 11), (13, 1), (1, 6), (1, 1)]


def _maps(b, h, w, c, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, w, c, generator=g, dtype=dtype) for _ in range(3)]


# ------------------------------------------------------------ exactness
@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('hw', SIZES)
@pytest.mark.parametrize('num_heads', [None, 2])
@pytest.mark.parametrize('scale', ['sqrt_n', 'n'])
def test_functional_matches_dense_float64(boundary, hw, num_heads, scale):
    q, k, v = _maps(2, *hw, 4)
    out = circulant_attention(q, k, v, boundary=boundary, num_heads=num_heads, scale=scale)
    ref = circulant_attention_dense(q, k, v, boundary, num_heads, scale)
    assert out.shape == q.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('hw', [(8, 8), (5, 7), (7, 11)])
def test_functional_float32_matches_dense(boundary, hw):
    # Unit-variance maps give O(1) logits. (With a very peaky p the zero
    # boundary divides by a tiny Z[i] and float32 error grows as eps / Z.)
    q, k, v = _maps(2, *hw, 6)
    out = circulant_attention(*(t.float() for t in (q, k, v)), boundary=boundary, num_heads=3)
    ref = circulant_attention_dense(q, k, v, boundary, 3)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_float_scale(boundary):
    q, k, v = _maps(1, 4, 5, 2)
    out = circulant_attention(q, k, v, boundary=boundary, scale=0.37)
    ref = circulant_attention_dense(q, k, v, boundary, None, 0.37)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


def test_scales_differ_by_sqrt_n():
    """'n' with logits x sqrt(N) equals 'sqrt_n' (s = 1/sqrt(N) vs 1/N)."""
    q, k, v = _maps(1, 6, 5, 3)
    a = circulant_attention(q, k, v, scale='sqrt_n')
    b = circulant_attention(q * math.sqrt(30), k, v, scale='n')
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, circulant_attention(q, k, v, scale='n'))


def test_circular_shift_equivariance():
    """BCCB attention commutes with circular shifts of the map."""
    q, k, v = _maps(1, 5, 7, 2)
    out = circulant_attention(q, k, v)
    shifted = circulant_attention(*(t.roll((2, 3), (1, 2)) for t in (q, k, v)))
    torch.testing.assert_close(shifted, out.roll((2, 3), (1, 2)))


def test_zero_boundary_constant_value_is_preserved():
    """Rows of the zero-boundary attention matrix sum to 1."""
    q, k, _ = _maps(2, 6, 9, 4)
    v = torch.full_like(q, 2.5)
    out = circulant_attention(q, k, v, boundary='zero', num_heads=2)
    torch.testing.assert_close(out, v)


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_batch_elements_independent(boundary):
    q, k, v = _maps(3, 4, 5, 2)
    out = circulant_attention(q, k, v, boundary=boundary)
    one = circulant_attention(q[1:2], k[1:2], v[1:2], boundary=boundary)
    torch.testing.assert_close(out[1:2], one)


def test_non_contiguous_inputs():
    q, k, v = _maps(2, 5, 4, 3)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not qt.is_contiguous()
    torch.testing.assert_close(circulant_attention(qt, kt, vt), circulant_attention(q, k, v))


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('num_heads', [None, 1])
def test_gradcheck(boundary, num_heads):
    q, k, v = (t.requires_grad_() for t in _maps(1, 3, 4, 2))
    assert torch.autograd.gradcheck(
        lambda q, k, v: circulant_attention(q, k, v, boundary=boundary, num_heads=num_heads),
        (q, k, v),
        fast_mode=True,
    )


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('num_heads', [None, 2])
def test_blocks_of_heads_give_the_same_result(boundary, num_heads, monkeypatch):
    """Processing heads in cache-sized blocks (here: one head per block) is
    exact, forward and backward, for the functional and the module."""
    torch.manual_seed(0)
    m = CirculantAttention(6, num_heads=num_heads, boundary=boundary).double()
    x = torch.randn(2, 20, 6, dtype=torch.float64, requires_grad=True)
    q, k, v = _maps(2, 4, 5, 6)

    def run():
        y = m(x, (4, 5))
        (gx,) = torch.autograd.grad(y.square().sum(), x)
        return y, gx, circulant_attention(q, k, v, boundary=boundary, num_heads=num_heads)

    whole = run()
    assert len(circulant.head_blocks(6, 6, (8, 9), 2)) == 1
    monkeypatch.setattr(circulant, 'BLOCK_BYTES', 1)
    assert len(circulant.head_blocks(6, 6, (8, 9), 2)) == 6
    for a, b in zip(run(), whole):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('num_heads', [None, 2])
def test_map_by_map_inverse_matches_dense(boundary, num_heads, monkeypatch):
    """The inverse one map at a time (large maps; here every map) matches the dense
    reference, functional and module, and its gradients pass gradcheck."""
    monkeypatch.setattr(circulant_transforms, 'MAP_BY_MAP_BYTES', 0)
    q, k, v = _maps(2, 5, 7, 4)
    out = circulant_attention(q, k, v, boundary=boundary, num_heads=num_heads)
    ref = circulant_attention_dense(q, k, v, boundary, num_heads)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.manual_seed(0)
    m = CirculantAttention(4, num_heads=num_heads, boundary=boundary).double()
    x = torch.randn(1, 12, 4, dtype=torch.float64, requires_grad=True)
    ref = circulant_module_dense(m, x.detach(), (3, 4))
    torch.testing.assert_close(m(x, (3, 4)), ref, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: m(x, (3, 4)), (x,), fast_mode=True)


def test_head_blocks_only_in_the_cpu_layout(monkeypatch):
    monkeypatch.setattr(circulant, 'BLOCK_BYTES', 1)
    assert len(circulant.head_blocks(6, 6, (8, 9), 2, cpu=True)) == 6
    assert circulant.head_blocks(6, 6, (8, 9), 2, cpu=False) == [slice(0, 6)]


@pytest.mark.parametrize('num_heads', [20, 40])
def test_head_blocks_at_most_max_blocks(num_heads, monkeypatch):
    """Heads that do not fit the budget (here: none does) are cut into at most
    MAX_HEAD_BLOCKS blocks of whole heads, covering every channel once in order."""
    monkeypatch.setattr(circulant, 'BLOCK_BYTES', 1)
    blocks = circulant.head_blocks(40, num_heads, (8, 9), 2)
    d = 40 // num_heads
    assert len(blocks) <= circulant.MAX_HEAD_BLOCKS < num_heads
    assert [c for sl in blocks for c in range(sl.start, sl.stop)] == list(range(40))
    assert all((sl.stop - sl.start) % d == 0 for sl in blocks)


# ------------------------------------------------------------ helpers
def test_next_fast_len_is_minimal_5_smooth():
    def smooth(m):
        for f in (2, 3, 5):
            while m % f == 0:
                m //= f
        return m == 1

    for n in range(1, 300):
        m = next_fast_len(n)
        assert m >= n and smooth(m)
        assert not any(smooth(j) for j in range(n, m))


@pytest.mark.parametrize(
    'hw, grid', [((4, 4), (8, 8)), ((5, 7), (9, 15)), ((1, 1), (1, 1)), ((97, 131), (200, 270))]
)
def test_zero_grid_covers_all_offsets(hw, grid):
    assert fft_grid(*hw, 'zero') == grid
    assert fft_grid(*hw, 'circular') == hw


def test_dense_reference_offsets_cover_all_pairs():
    """Sanity of the reference itself: each offset m has the expected count."""
    idx, n_off = offset_index(3, 4, 'zero')
    counts = torch.bincount(idx.flatten(), minlength=n_off).view(5, 7)
    mr = torch.arange(-2, 3).abs()
    mc = torch.arange(-3, 4).abs()
    assert torch.equal(counts, (3 - mr)[:, None] * (4 - mc)[None, :])


# ------------------------------------------------------------ module
@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('num_heads', [None, 2])
def test_module_one_fft_equals_project_then_attend(boundary, num_heads):
    torch.manual_seed(0)
    m = CirculantAttention(6, num_heads=num_heads, boundary=boundary).double()
    b, h, w = 2, 5, 7
    x = torch.randn(b, h * w, 6, dtype=torch.float64)
    q, k, v = (t.reshape(b, h, w, 6) for t in m.qkv(x).chunk(3, dim=-1))
    o = circulant_attention(q, k, v, boundary=boundary, num_heads=num_heads)
    expected = m.proj(o.reshape(b, h * w, 6) * m.gate(x))
    torch.testing.assert_close(m(x, (h, w)), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('hw', [(6, 6), (4, 7), (11, 1)])
def test_module_matches_dense(boundary, hw):
    torch.manual_seed(0)
    m = CirculantAttention(4, boundary=boundary, scale='n')
    x = torch.randn(2, hw[0] * hw[1], 4)
    ref = circulant_module_dense(m.double(), x.double(), hw)
    torch.testing.assert_close(m.float()(x, hw).double(), ref, rtol=1e-5, atol=1e-5)


def test_module_parameter_names_match_official():
    m = CirculantAttention(8)
    assert set(dict(m.named_parameters())) == {
        'gate.0.weight',
        'gate.0.bias',
        'qkv.weight',
        'proj.weight',
        'proj.bias',
    }


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_module_gradcheck(boundary):
    torch.manual_seed(0)
    m = CirculantAttention(2, boundary=boundary).double()
    x = torch.randn(1, 6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: m(x, (2, 3)), (x,), fast_mode=True)


# ------------------------------------------------------------ mixed precision
class _RecordDtypes(TorchDispatchMode):
    """Records the input dtypes of FFT and softmax ops."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name.startswith('_fft') or name == '_softmax':
            self.seen.append((name, args[0].dtype))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_autocast_bf16_runs_fft_and_softmax_in_fp32(boundary):
    torch.manual_seed(0)
    m = CirculantAttention(4, boundary=boundary)
    x = torch.randn(1, 30, 4)
    with torch.autocast('cpu', dtype=torch.bfloat16), _RecordDtypes() as rec:
        y = m(x, (5, 6))
    assert y.dtype == torch.bfloat16
    assert {n for n, _ in rec.seen} >= {'_fft_r2c', '_fft_c2r', '_softmax'}
    assert all(dt in (torch.float32, torch.complex64) for _, dt in rec.seen)
    torch.testing.assert_close(y.float(), m(x, (5, 6)), rtol=0.05, atol=0.02)


class _RecordMatmuls(TorchDispatchMode):
    """Records the input dtypes of the matrix products."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ('bmm', 'baddbmm', 'mm', 'addmm'):
            self.seen.append(tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_autocast_bf16_runs_every_linear_in_bf16(boundary):
    """gate, the qkv product on the spectrum and proj: three bf16 matrix products."""
    torch.manual_seed(0)
    m = CirculantAttention(4, boundary=boundary)
    with torch.autocast('cpu', dtype=torch.bfloat16), _RecordMatmuls() as rec:
        m(torch.randn(1, 30, 4), (5, 6))
    assert len(rec.seen) == 3
    assert all(set(dts) == {torch.bfloat16} for dts in rec.seen), rec.seen


class _RecordSpectrumCasts(TorchDispatchMode):
    """Counts the bf16 casts of a tensor with ``numel`` elements and the bmm calls."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.casts, self.bmms = numel, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == '_to_copy' and (kwargs or {}).get('dtype') == torch.bfloat16:
            self.casts += args[0].numel() == self.numel
        self.bmms += name == 'bmm'
        return func(*args, **(kwargs or {}))


def test_autocast_bf16_casts_the_spectrum_once_for_all_head_blocks(monkeypatch):
    """Every block's qkv product reads the whole spectrum: it is cast to bf16 once per
    layer, not once per block."""
    monkeypatch.setattr(circulant, 'BLOCK_BYTES', 1)  # one head per block
    torch.manual_seed(0)
    m = CirculantAttention(4)
    h, w = 5, 6
    spectrum = 4 * h * (w // 2 + 1) * 2  # (B, C, H, U, 2) real view, B = 1
    with torch.autocast('cpu', dtype=torch.bfloat16), _RecordSpectrumCasts(spectrum) as rec:
        m(torch.randn(1, h * w, 4), (h, w))
    assert rec.bmms == 4  # four blocks, one qkv product each
    assert rec.casts == 1


def test_autocast_bf16_functional_no_nan_256():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 256, 256, 2) * 4 for _ in range(3))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = circulant_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    ref = circulant_attention(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float())
    torch.testing.assert_close(out.float(), ref, rtol=0.02, atol=0.02)


def test_autocast_bf16_module_no_nan_256():
    torch.manual_seed(0)
    m = CirculantAttention(4, boundary='zero')
    x = torch.randn(1, 256 * 256, 4) * 4
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = m(x, (256, 256))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


def test_half_input_without_autocast_returns_half():
    q, k, v = _maps(1, 4, 4, 2, dtype=torch.bfloat16)
    out = circulant_attention(q, k, v)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), circulant_attention(q.float(), k.float(), v.float()), rtol=0.02, atol=0.02
    )


# ------------------------------------------------------------ bad input
_q = torch.zeros(1, 4, 4, 2)


@pytest.mark.parametrize(
    'args, kwargs, match',
    [
        ((_q[0], _q[0], _q[0]), {}, 'q must be a 4-D'),
        ((_q, _q[..., :1], _q), {}, 'same shape'),
        ((_q, _q, _q.expand(2, -1, -1, -1)), {}, 'same shape'),
        ((_q.long(), _q.long(), _q.long()), {}, 'floating point'),
        ((_q, _q, _q), {'boundary': 'reflect'}, 'boundary must be one of'),
        ((_q, _q, _q), {'scale': 'log'}, 'scale must be'),
        ((_q, _q, _q), {'scale': -1.0}, 'scale must be'),
        ((_q, _q, _q), {'scale': True}, 'scale must be'),
        ((_q, _q, _q), {'num_heads': 3}, 'num_heads must be'),
        ((_q, _q, _q), {'num_heads': 0}, 'num_heads must be'),
        ((_q[:, :0], _q[:, :0], _q[:, :0]), {}, 'H, W, C >= 1'),
    ],
)
def test_functional_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        circulant_attention(*args, **kwargs)


@pytest.mark.parametrize(
    'kwargs, match',
    [
        ({'dim': 0}, 'dim must be'),
        ({'dim': 6, 'num_heads': 4}, 'num_heads must be'),
        ({'dim': 4, 'boundary': 'wrap'}, 'boundary must be one of'),
        ({'dim': 4, 'scale': 0}, 'scale must be'),
    ],
)
def test_module_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CirculantAttention(**kwargs)


@pytest.mark.parametrize(
    'x_shape, hw, match',
    [
        ((1, 12, 4), (3, 5), 'N=12 tokens'),
        ((1, 12, 3), (3, 4), 'dim=4'),
        ((12, 4), (3, 4), '3-D tensor'),
        ((1, 12, 4), (12,), 'hw_shape must be'),
        ((1, 12, 4), (3.0, 4), 'hw_shape must be'),
        ((1, 0, 4), (0, 4), 'hw_shape must be'),
    ],
)
def test_module_bad_input(x_shape, hw, match):
    m = CirculantAttention(4)
    with pytest.raises(ValueError, match=match):
        m(torch.zeros(x_shape), hw)
