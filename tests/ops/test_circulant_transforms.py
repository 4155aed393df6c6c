"""The 2-D transforms of circulant attention, both backends (mmcirc/ops/circulant_transforms.py).

References: torch.fft on the zero-padded map (for the matmul-DFT backend), explicit
complex arithmetic, and brute-force sums over offsets (the row mass Z).
"""

import pytest
import torch

from mmcirc.ops import circulant, circulant_transforms
from mmcirc.ops.circulant_transforms import MatmulDFT, TorchFFT, transforms
from mmcirc.ops.settings import export_mode

# square, non-square, odd, prime, one row / column; 'zero' grids rounded up and exact
SIZES = [(4, 4), (5, 7), (7, 11), (13, 1), (1, 6)]
BOUNDARIES = ['circular', 'zero']


def _backends(hw, boundary):
    return [TorchFFT(hw, boundary), MatmulDFT(hw, boundary, torch.float64, 'cpu')]


def _complex(tf, y):
    """A spectrum of either backend as a complex tensor."""
    return y if y.is_complex() else torch.view_as_complex(y.contiguous())


def _spectrum(tf, z):
    """A complex tensor in the spectrum layout of backend ``tf``."""
    return z if isinstance(tf, TorchFFT) else torch.view_as_real(z)


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('hw', SIZES)
def test_rfft2_is_the_zero_padded_half_spectrum(hw, boundary):
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    for tf in _backends(hw, boundary):
        ref = torch.fft.rfft2(x, s=tf.grid)  # the padded map's half spectrum
        torch.testing.assert_close(_complex(tf, tf.rfft2(x)), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('hw', SIZES)
def test_irfft2_inverts_and_crops(hw, boundary):
    for tf in _backends(hw, boundary):
        full = torch.randn(2, 3, *tf.grid, dtype=torch.float64)
        y = tf.rfft2(full)
        torch.testing.assert_close(tf.irfft2(y, tf.grid), full, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(
            tf.irfft2(y, hw), full[..., : hw[0], : hw[1]], rtol=1e-10, atol=1e-10
        )


@pytest.mark.parametrize('boundary', BOUNDARIES)
@pytest.mark.parametrize('hw', SIZES)
def test_irfft2_map_by_map_inverts_and_crops(hw, boundary, monkeypatch):
    """Large maps (here: every map) are inverted one at a time, to the same result."""
    monkeypatch.setattr(circulant_transforms, 'MAP_BY_MAP_BYTES', 0)
    tf = TorchFFT(hw, boundary, torch.float64, maps=True)
    full = torch.randn(2, 3, *tf.grid, dtype=torch.float64)
    y = tf.rfft2(full)
    assert tf.maps
    torch.testing.assert_close(tf.irfft2(y, tf.grid), full, rtol=1e-10, atol=1e-10)
    crop = tf.irfft2(y, hw)
    assert crop.shape == (2, 3, *hw)
    torch.testing.assert_close(crop, full[..., : hw[0], : hw[1]], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('boundary', BOUNDARIES)
def test_irfft2_map_by_map_makes_no_layout_copy(boundary, monkeypatch):
    """Map by map, every 1-D pass batches at stride 1: torch's FFT copies no spectrum (the
    batched irfft2 copies it twice, inside its kernels); the only copies are each map's
    real (H, W) result into the output."""
    monkeypatch.setattr(circulant_transforms, 'MAP_BY_MAP_BYTES', 0)
    tf = TorchFFT((9, 7), boundary, maps=True)
    y = tf.rfft2(torch.randn(2, 3, *tf.grid))
    with torch.profiler.profile(record_shapes=True) as prof:
        tf.irfft2(y, (9, 7))
    ops = [(e.name, e.input_shapes) for e in prof.events()]
    assert sum(n == 'aten::_fft_c2r' for n, _ in ops) == 6  # one per map
    copies = [s for n, s in ops if n in ('aten::copy_', 'aten::clone', 'aten::contiguous')]
    assert copies and all(s[:2] == [[9, 7], [9, 7]] for s in copies)


def test_map_by_map_only_for_large_maps_in_the_cpu_layout_outside_capture():
    big = circulant_transforms.MAP_BY_MAP_BYTES // 8  # complex64 values of one map
    side = int((2 * big) ** 0.5) + 2  # one (side, side // 2 + 1) spectrum: more than that
    assert transforms((side, side), 'circular', torch.float32, 'cpu', cpu=True).maps
    assert not transforms((side, side), 'circular', torch.float32, 'cpu', cpu=False).maps
    assert not transforms((side // 2, side // 2), 'circular', torch.float32, 'cpu', cpu=True).maps
    seen = []  # traced graphs keep the batched call

    def record(y):
        seen.append(transforms((side, side), 'circular', torch.float32, 'cpu', cpu=True).maps)
        return y * 1

    torch.jit.trace(record, torch.zeros(1), check_trace=False)
    assert seen == [False]


def test_backends_grids():
    """'zero': the torch backend rounds (2H-1) x (2W-1) up to 5-smooth lengths and says
    whether it padded; the export backend uses the exact offsets grid."""
    tf, ex = _backends((7, 11), 'zero')
    assert (tf.grid, tf.padded) == ((15, 24), True)
    assert (ex.grid, ex.padded) == ((13, 21), False)
    assert TorchFFT((5, 8), 'zero').padded is False  # 9 x 15 is 5-smooth already
    assert TorchFFT((7, 11), 'circular').grid == (7, 11)


@pytest.mark.parametrize('d', [1, 3])
def test_corr_and_apply_are_the_spectral_products(d):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 5, 4, dtype=torch.complex128, generator=g) for _ in range(3))
    p = torch.randn(2, 6 // d, 5, 4, dtype=torch.complex128, generator=g)
    corr = (q * k.conj()).view(2, 6 // d, d, 5, 4).sum(2)  # FFT of the flipped scores
    apply = (p[:, :, None] * v.view(2, 6 // d, d, 5, 4)).reshape(2, 6, 5, 4)  # p = FFT(p')
    for tf in _backends((3, 3), 'zero'):
        out = tf.corr(_spectrum(tf, q), _spectrum(tf, k), d)
        torch.testing.assert_close(_complex(tf, out), corr)
        out = tf.apply(_spectrum(tf, p), _spectrum(tf, v), d)
        torch.testing.assert_close(_complex(tf, out), apply)


def test_linear_is_the_channel_product():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(2, 4, 3, 5, dtype=torch.complex128, generator=g)
    w = torch.randn(6, 4, dtype=torch.float64, generator=g)
    ref = torch.einsum('oc,bcij->boij', w.to(y.dtype), y)
    for tf in _backends((3, 3), 'circular'):
        out = tf.linear(w, tf.operand(_spectrum(tf, y)), torch.float64)
        torch.testing.assert_close(_complex(tf, out), ref)


def test_linear_on_a_bf16_operand_is_the_channel_product():
    """A bf16 operand gives the channel product to bf16 accuracy, in the compute dtype."""
    g = torch.Generator().manual_seed(0)
    y = torch.randn(1, 4, 3, 5, dtype=torch.complex64, generator=g)
    w = torch.randn(6, 4, generator=g)
    ref = torch.einsum('oc,bcij->boij', w.to(y.dtype), y)
    for tf in _backends((3, 3), 'circular'):
        r = tf.operand(_spectrum(tf, y), torch.bfloat16)
        assert r.dtype == torch.bfloat16
        out = tf.linear(w, r, torch.float32)
        assert out.dtype in (torch.float32, torch.complex64)
        torch.testing.assert_close(_complex(tf, out), ref, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize(
    'hw, grid', [((3, 4), (5, 7)), ((3, 4), (8, 9)), ((1, 5), (2, 10)), ((4, 1), (7, 1))]
)
def test_row_mass_sums_the_in_map_offsets(hw, grid):
    """Z[i] = sum_m p[-m] [i + m inside] from the flipped p' (index -m), brute force over
    the offsets of a wrapped grid."""
    h, w = hw
    p = torch.rand(2, *grid, dtype=torch.float64)
    ref = torch.zeros(2, h, w, dtype=torch.float64)
    for r in range(h):
        for c in range(w):
            for mr in range(-r, h - r):
                for mc in range(-c, w - c):
                    ref[:, r, c] += p[:, -mr % grid[0], -mc % grid[1]]
    torch.testing.assert_close(circulant_transforms.row_mass(p, hw), ref, rtol=1e-12, atol=1e-12)


def test_mask_padding_leaves_exactly_the_offsets():
    hw, grid = (3, 4), (8, 9)
    a = circulant_transforms.mask_padding(torch.zeros(1, *grid), hw)
    r, c = torch.arange(grid[0]), torch.arange(grid[1])
    # offsets 0..H-1 at rows 0..H-1, -(H-1)..-1 at rows P-(H-1)..P-1 (likewise columns)
    valid = ((r < 3) | (r >= 8 - 2))[:, None] & ((c < 4) | (c >= 9 - 3))[None, :]
    assert torch.equal(torch.isfinite(a[0]), valid)


@pytest.mark.parametrize('hw, grid', [((3, 4), (8, 9)), ((5, 2), (10, 4)), ((1, 3), (1, 6))])
def test_mask_padding_is_the_same_for_negated_offsets(hw, grid):
    """The scores are kept at the negated offsets a[-m]: the masked band must be the same
    set of cells under m -> -m (index j -> -j mod P)."""
    a = torch.isfinite(circulant_transforms.mask_padding(torch.zeros(*grid), hw))
    neg = [(-torch.arange(n)) % n for n in grid]
    assert torch.equal(a, a[neg[0]][:, neg[1]])


@pytest.mark.parametrize('b', [1, 3])
def test_transpose_tokens_copies_within_one_dtype(b):
    """Without a cast the result is still a contiguous copy (``.to(memory_format=...)``
    aliases a transposed 3-D tensor: the FFTs would read a strided view)."""
    x = torch.randn(b, 10, 4)
    y = circulant.transpose_tokens(x)
    assert y.is_contiguous() and y.stride() == (40, 10, 1)
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert torch.equal(y, x.transpose(1, 2))


@pytest.mark.parametrize('b', [1, 3])
def test_transpose_tokens(b):
    x = torch.randn(b, 10, 4, requires_grad=True)
    y = circulant.transpose_tokens(x, torch.float64)
    assert y.is_contiguous() and y.dtype == torch.float64
    torch.testing.assert_close(y, x.transpose(1, 2).double())
    (g,) = torch.autograd.grad((y * torch.arange(40.0).view(1, 4, 10)).sum(), x)
    torch.testing.assert_close(g, torch.arange(40.0).view(4, 10).t().expand(b, -1, -1))


def test_transforms_follow_the_active_backend():
    assert isinstance(transforms((3, 4), 'zero', torch.float32, 'cpu'), TorchFFT)
    with export_mode():
        assert isinstance(transforms((3, 4), 'zero', torch.float32, 'cpu'), MatmulDFT)
