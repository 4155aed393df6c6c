"""Circulant attention (METHOD.md section 1; Han et al., arXiv 2512.21542).

Per head (``d`` channels sharing one score map), with ``s`` the scale::

    a[m] = s * sum_i sum_{c in head} q[i, c] k[i (+) m, c]    (Eq. 15)
    p    = softmax over the offsets m of a
    o[i] = sum_m p[m] v[i (+) m]                             (Eq. 16)

The attention matrix ``A[i, j] = p[j (-) i]`` is block-circulant (BCCB), so
both sums are 2-D cross-correlations and cost O(N log N) with FFTs:
``FFT(a) = s * sum_c conj(Q_c) K_c`` and ``FFT(o) = conj(P) V``.

Two boundary modes:

* ``'circular'`` (the paper): ``(+)`` wraps around the H x W map; FFTs on
  H x W.
* ``'zero'``: no wrap-around. Offsets m lie in [-(H-1), H-1] x [-(W-1), W-1],
  ``a[m]`` sums only pairs inside the map, the softmax runs over these
  (2H-1)(2W-1) offsets, ``o[i]`` sums only over ``i + m`` inside the map and
  is divided by ``Z[i] = sum_m p[m] [i + m inside]``. The FFTs run on a
  zero-padded grid of at least (2H-1) x (2W-1) (rounded up to a 5-smooth
  length), on which the circular correlation of the padded maps does not
  alias.

Every FFT and the softmax run in float32 (float64 for float64 inputs) with
autocast disabled; the result is cast back to the autocast / input dtype.

This file depends on torch only.
"""

import contextlib
import math
from numbers import Real

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    'circulant_attention',
    'CirculantAttention',
    'next_fast_len',
    'fft_grid',
    'export_mode',
    'get_fft_impl',
    'set_fft_impl',
]

BOUNDARIES = ('circular', 'zero')
SCALES = ('sqrt_n', 'n')
#: How the 2-D DFTs run: ``'torch'`` (torch.fft, the default) or ``'dft'``
#: (real matmuls, exportable; see :func:`export_mode`).
FFT_IMPLS = ('torch', 'dft')
_FFT_IMPL = 'torch'


# ----------------------------------------------------------------- helpers
def next_fast_len(n):
    """Smallest 5-smooth integer (only prime factors 2, 3, 5) >= ``n``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f'n must be a positive int, got {n!r}')
    m = n
    while True:
        r = m
        for f in (2, 3, 5):
            while r % f == 0:
                r //= f
        if r == 1:
            return m
        m += 1


def fft_grid(h, w, boundary='circular'):
    """FFT grid (Ph, Pw) used for an ``h x w`` map with the given boundary.

    ``'circular'``: the map itself. ``'zero'``: at least (2h-1) x (2w-1), so
    that offsets in [-(h-1), h-1] x [-(w-1), w-1] do not alias, rounded up to
    a fast FFT length.
    """
    _check_choice('boundary', boundary, BOUNDARIES)
    if boundary == 'circular':
        return h, w
    return next_fast_len(2 * h - 1), next_fast_len(2 * w - 1)


def _check_choice(name, value, allowed):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f'{name} must be one of {allowed}, got {value!r}')


def _num_heads(channels, num_heads):
    """Validate ``num_heads`` (None = one head per channel); return it."""
    if num_heads is None:
        return channels
    if (
        isinstance(num_heads, bool)
        or not isinstance(num_heads, int)
        or num_heads < 1
        or channels % num_heads
    ):
        raise ValueError(
            f'num_heads must be None or a positive int dividing '
            f'the channel count {channels}, got {num_heads!r}'
        )
    return num_heads


def _check_scale(scale):
    ok = (
        scale in SCALES
        if isinstance(scale, str)
        else isinstance(scale, Real)
        and not isinstance(scale, bool)
        and math.isfinite(scale)
        and scale > 0
    )
    if not ok:
        raise ValueError(f"scale must be 'sqrt_n', 'n' or a positive float, got {scale!r}")


def _scale_value(scale, n, d):
    """s for N = n real tokens and head width d (METHOD.md, 'Scale')."""
    _check_scale(scale)
    if scale == 'sqrt_n':
        return 1.0 / math.sqrt(n * d)  # official code (d = 1: 1/sqrt(N))
    if scale == 'n':
        return 1.0 / (n * math.sqrt(d))  # paper Eq. 15, resolution invariant
    return float(scale)


def _autocast_dtype(device_type):
    """The autocast dtype active for ``device_type``, or None."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4: per-device functions
        if device_type == 'cuda' and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if device_type == 'cpu' and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
    return None


def _dtypes(t):
    """(compute dtype, output dtype) for an input tensor ``t``."""
    if t.dtype == torch.float64:
        return torch.float64, torch.float64
    return torch.float32, _autocast_dtype(t.device.type) or t.dtype


def _fp32_region(t):
    """Context with autocast off on ``t``'s device (FFTs need fp32)."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def _irfft2(x, grid, hw):
    """irfft2 of (..., Ph, Pw//2+1) on ``grid``, cropped to (..., H, W)."""
    if tuple(grid) == tuple(hw):
        return torch.fft.irfft2(x, s=grid)
    x = torch.fft.ifft(x, dim=-2)[..., : hw[0], :]  # (..., H, Pw//2+1)
    return torch.fft.irfft(x, n=grid[1], dim=-1)[..., : hw[1]]  # (..., H, W)


def _valid_offsets(hw, grid, device):
    """Bool (Ph, Pw): True where the wrapped index is an offset in
    [-(H-1), H-1] x [-(W-1), W-1] (index m >= 0 at m, m < 0 at P + m)."""
    (h, w), (ph, pw) = hw, grid
    r = torch.arange(ph, device=device)
    c = torch.arange(pw, device=device)
    return ((r < h) | (r > ph - h))[:, None] & ((c < w) | (c > pw - w))[None, :]


def _row_mass(p, hw):
    """Z[i] = sum_m p[m] [i + m inside the map], as box sums: (..., H, W).

    For i = (r, c) the admissible offsets form the rectangle
    [-r, H-1-r] x [-c, W-1-c]; with p re-ordered by offset (index m + H-1),
    that is the window of H rows starting at row H-1-r (likewise columns),
    summed in O(N) with cumulative sums.
    """
    h, w = hw
    # wrapped (..., Ph, Pw) -> ordered by offset (..., 2H-1, 2W-1)
    p = torch.roll(p, (h - 1, w - 1), (-2, -1))[..., : 2 * h - 1, : 2 * w - 1]
    return _box_sums(p, hw)


def _box_sums(p, hw):
    """:func:`_row_mass` of p (..., 2H-1, 2W-1) ordered by offset."""
    h, w = hw
    c = F.pad(p.cumsum(-2), (0, 0, 1, 0))  # (..., 2H, 2W-1), c[k] = sum_{<k}
    p = (c[..., h:, :] - c[..., :h, :]).flip(-2)  # (..., H, 2W-1)
    c = F.pad(p.cumsum(-1), (1, 0))  # (..., H, 2W)
    return (c[..., w:] - c[..., :w]).flip(-1)  # (..., H, W)


BLOCK_BYTES = 1 << 23  # CPU: spectra of one block of heads ~8 MiB (cache)
CUDA_BLOCK_BYTES = 1 << 26  # CUDA: ~64 MiB (few launches, bounded memory)


def _head_blocks(channels, num_heads, grid, batch=1, device_type='cpu'):
    """Channel slices of whole heads, each block's q/k/v spectra about
    BLOCK_BYTES (CUDA: CUDA_BLOCK_BYTES).

    Heads are independent. On the CPU, blocks keep every FFT and product in
    cache (one large batch of FFTs runs several times slower); on a GPU,
    small blocks only multiply kernel launches, so blocks there are large and
    only bound the temporary memory.
    """
    d = channels // num_heads
    per_head = 3 * batch * d * grid[0] * (grid[1] // 2 + 1) * 8  # q, k, v
    budget = CUDA_BLOCK_BYTES if device_type == 'cuda' else BLOCK_BYTES
    step = d * max(1, min(num_heads, budget // per_head))
    return [slice(i, min(i + step, channels)) for i in range(0, channels, step)]


def _attend_spectra(q, k, v, hw, grid, num_heads, s, boundary):
    """Eq. 15, softmax, Eq. 16 from spectra (B, C, Ph, Pw//2+1) of q, k, v
    (unnormalised rfft2 on ``grid``). Returns o (B, C, H, W)."""
    b, c = q.shape[:2]
    d = c // num_heads
    f = q.shape[-2:]
    # Eq. 15: FFT(a) = s sum_{c in head} conj(Q_c) K_c (B, heads, Ph, Pw//2+1)
    a = q.conj() * k  # (B, C, Ph, Pw//2+1)
    a = a if d == 1 else a.view(b, num_heads, d, *f).sum(2)
    a = torch.fft.irfft2(a, s=grid)  # (B, heads, Ph, Pw)
    a = a if s == 1 else a * s
    if boundary == 'zero':  # softmax only over the (2H-1)(2W-1) true offsets
        # (Z would cancel the padding offsets' share anyway; the mask keeps
        # the softmax max over real offsets, so their p cannot underflow)
        a = a.masked_fill(~_valid_offsets(hw, grid, a.device), float('-inf'))
    p = torch.softmax(a.flatten(2), dim=-1).view_as(a)  # (B, heads, Ph, Pw)
    # Eq. 16: FFT(o) = conj(P) V, per channel of the head
    pf = torch.fft.rfft2(p).conj()  # (B, heads, Ph, Pw//2+1), lazy conj
    o = (
        pf * v if d == 1 else (pf.unsqueeze(2) * v.view(b, num_heads, d, *f)).view(b, c, *f)
    )  # (B, C, Ph, Pw//2+1)
    o = _irfft2(o, grid, hw)  # (B, C, H, W)
    if boundary == 'zero':  # renormalise rows of A over in-map tokens
        z = _row_mass(p, hw).unsqueeze(2)  # (B, heads, 1, H, W)
        o = (o.view(b, num_heads, d, *hw) / z).view(b, c, *hw)
    return o  # (B, C, H, W)


# ----------------------------------------------------------------- export path
@contextlib.contextmanager
def export_mode(enabled=True):
    """Context: circulant attention runs its 2-D DFTs as real matmuls.

    ``torch.onnx.export`` (both exporters) and other tracers without complex
    tensors fail on ``torch.fft``. Inside this context every DFT of
    :func:`circulant_attention` and :class:`CirculantAttention` is two real
    matrix products with cos/sin matrices built in the forward from the
    runtime H and W (traced as ops, so a dynamic-shape graph follows the
    input size), on (real, imag) pairs of the half spectrum. Equal to the
    default path up to rounding (tested in float64); cost O(N (H + W)) per
    channel instead of O(N log N), so use it for export only. With
    ``boundary='zero'`` the grid is exactly (2H-1) x (2W-1) (every cell an
    offset; any grid at least that large gives the same result). Sets a module
    global (not thread-safe); the previous mode is restored on exit.
    """
    prev = _FFT_IMPL
    set_fft_impl('dft' if enabled else 'torch')
    try:
        yield
    finally:
        set_fft_impl(prev)


def get_fft_impl():
    """The active DFT implementation, ``'torch'`` or ``'dft'``."""
    return _FFT_IMPL


def set_fft_impl(impl):
    """Select the DFT implementation: ``'torch'`` (default) or ``'dft'``."""
    global _FFT_IMPL
    _check_choice('impl', impl, FFT_IMPLS)
    _FFT_IMPL = impl


# ----------------------------------------------------------------- functional
def _check_maps(q, k, v):
    for name, t in (('q', q), ('k', k), ('v', v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(
                f'{name} must be a 4-D tensor (B, H, W, C), got {getattr(t, "shape", type(t))}'
            )
        if not t.is_floating_point():
            raise ValueError(f'{name} must be floating point, got {t.dtype}')
    if not q.shape == k.shape == v.shape:
        raise ValueError(
            f'q, k, v must have the same shape (B, H, W, C), '
            f'got {tuple(q.shape)}, {tuple(k.shape)}, '
            f'{tuple(v.shape)}'
        )
    if min(q.shape[1:]) < 1:
        raise ValueError(f'q, k, v need H, W, C >= 1, got {tuple(q.shape)}')


def circulant_attention(q, k, v, *, boundary='circular', num_heads=None, scale='sqrt_n'):
    """Circulant attention (Eqs. 15-16) of feature maps.

    Args:
        q, k, v (Tensor): (B, H, W, C), any H and W.
        boundary (str): ``'circular'`` (wrap-around, the paper) or ``'zero'``
            (no wrap-around, rows renormalised over in-map tokens).
        num_heads (int, optional): heads; the C/num_heads channels of a head
            share one score map and softmax. None: one head per channel (d=1).
        scale (str | float): ``'sqrt_n'`` (default, official code):
            s = 1/sqrt(N*d); ``'n'`` (paper Eq. 15, resolution invariant):
            s = 1/(N*sqrt(d)); or a positive float. N = H*W.

    Returns:
        Tensor: (B, H, W, C) in the input dtype (the autocast dtype under
        autocast); computed in float32 (float64 for float64 inputs).
    """
    _check_maps(q, k, v)
    _check_choice('boundary', boundary, BOUNDARIES)
    if _FFT_IMPL == 'dft':  # export path (real arithmetic, no torch.fft)
        return _circulant_attention_dft(q, k, v, boundary, num_heads, scale)
    b, h, w, c = q.shape
    heads = _num_heads(c, num_heads)
    s = _scale_value(scale, h * w, c // heads)
    grid = fft_grid(h, w, boundary)
    cdt, odt = _dtypes(q)
    d = c // heads
    with _fp32_region(q):
        # (B, H, W, C) -> (B, C, H, W) views; FFTs over contiguous last axes
        q, k, v = (t.to(cdt).permute(0, 3, 1, 2) for t in (q, k, v))
        o = []
        for sl in _head_blocks(c, heads, grid, b, q.device.type):  # heads
            qb, kb, vb = (
                torch.fft.rfft2(t[:, sl].contiguous(), s=grid) for t in (q, k, v)
            )  # (B, Cb, Ph, Pw//2+1) each
            o.append(_attend_spectra(qb, kb, vb, (h, w), grid, qb.shape[1] // d, s, boundary))
        o = torch.cat(o, dim=1)  # (B, C, H, W)
    return o.permute(0, 2, 3, 1).to(odt, memory_format=torch.contiguous_format)


# ----------------------------------------------------------------- module
def _linear_spectrum(weight, x):
    """Real weight (C_out, C) on complex x (B, C, ...): (B, C_out, ...)."""
    b, c = x.shape[:2]
    x = torch.view_as_real(x)  # (B, C, ..., 2)
    y = torch.bmm(weight.expand(b, -1, -1), x.reshape(b, c, -1))
    return torch.view_as_complex(y.view(b, -1, *x.shape[2:]))


def _linear_cf(layer, x, channels_last=False):
    """nn.Linear ``layer`` on channels-first x (B, C_in, N), without copies.

    Returns (B, C_out, N), or (B, N, C_out) with ``channels_last``.
    """
    b = x.shape[0]
    w = layer.weight.expand(b, -1, -1)  # (B, C_out, C_in)
    if channels_last:  # (B, N, C_in) @ (B, C_in, C_out)
        x, w = x.transpose(1, 2), w.transpose(1, 2)
        return torch.baddbmm(layer.bias, x, w) if layer.bias is not None else torch.bmm(x, w)
    return torch.baddbmm(layer.bias[:, None], w, x) if layer.bias is not None else torch.bmm(w, x)


class CirculantAttention(nn.Module):
    """The official circulant attention layer (CA-DeiT), for any H x W.

    ``y = proj(CA(x W_q, x W_k, x W_v) * SiLU(gate(x)))`` where the bias-free
    qkv projection is applied to the spectrum of x (one FFT instead of three:
    FFT(x W) = FFT(x) W for a real W; with ``boundary='zero'`` this holds on
    the zero-padded grid too, because padding commutes with the projection),
    so it equals projecting q, k, v and calling :func:`circulant_attention`.
    Parameter names match the official code (``gate.0``, ``qkv``, ``proj``);
    gate and output projection run channels-first (batched matmuls on the
    layer weights) so that the tokens are transposed only once.

    Args:
        dim (int): channels C.
        num_heads (int, optional): see :func:`circulant_attention`
            (None: d = 1, the paper's setting).
        boundary (str): ``'circular'`` or ``'zero'``.
        scale (str | float): ``'sqrt_n'``, ``'n'`` or a positive float.
        proj_drop (float): dropout after the output projection.
    """

    def __init__(self, dim, num_heads=None, boundary='circular', scale='sqrt_n', proj_drop=0.0):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f'dim must be a positive int, got {dim!r}')
        _check_choice('boundary', boundary, BOUNDARIES)
        _check_scale(scale)
        self.dim = dim
        self.num_heads = _num_heads(dim, num_heads)
        self.boundary = boundary
        self.scale = scale
        self.gate = nn.Sequential(nn.Linear(dim, dim), nn.SiLU())  # Eq. 20
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self):
        return (
            f'dim={self.dim}, num_heads={self.num_heads}, '
            f'boundary={self.boundary!r}, scale={self.scale!r}'
        )

    def forward(self, x, hw_shape):
        """x: (B, N, C) tokens of an H x W map (row-major), hw_shape = (H, W).
        Returns (B, N, C)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(
                f'x must be a 3-D tensor (B, N, C), got {getattr(x, "shape", type(x))}'
            )
        if x.shape[-1] != self.dim:
            raise ValueError(f'x must have dim={self.dim} channels, got {x.shape[-1]}')
        if (
            not isinstance(hw_shape, (tuple, list))
            or len(hw_shape) != 2
            or not all(
                isinstance(n, (int, torch.SymInt)) and not isinstance(n, bool) and n >= 1
                for n in hw_shape
            )
        ):
            raise ValueError(f'hw_shape must be (H, W) with positive ints, got {hw_shape!r}')
        b, n, c = x.shape
        h, w = hw_shape
        if n != h * w:
            raise ValueError(f'x has N={n} tokens but hw_shape={tuple(hw_shape)} gives H*W={h * w}')
        if _FFT_IMPL == 'dft':  # export path (real arithmetic, no torch.fft)
            return self._forward_dft(x, (h, w))
        grid = fft_grid(h, w, self.boundary)
        s = _scale_value(self.scale, n, c // self.num_heads)
        cdt, odt = _dtypes(x)

        x = x.transpose(1, 2)  # (B, C, N) view: channels first from here on
        t = self.gate[1](_linear_cf(self.gate[0], x))  # Eq. 20 gate (B, C, N)
        with _fp32_region(x):
            x = x.to(cdt).reshape(b, c, h, w)  # (B, C, H, W), contiguous
            wqkv = self.qkv.weight.to(cdt).view(3, c, c)  # W_q, W_k, W_v
            # FFT(x W) = FFT(x) W: a real weight commutes with the FFT, and
            # with the zero padding of boundary='zero' (grid > H x W)
            x = torch.fft.rfft2(x, s=grid)  # (B, C, Ph, Pw//2+1)
            y = t.new_empty(t.shape)  # gated output o * t, (B, C, N)
            for sl in _head_blocks(c, self.num_heads, grid, b, x.device.type):
                # rows of W_q (scaled by s: Eq. 15's scale for free), W_k, W_v
                wb = torch.cat([wqkv[0, sl] * s, wqkv[1, sl], wqkv[2, sl]])
                qkv = _linear_spectrum(wb, x)  # (B, 3Cb, Ph, Pw//2+1)
                q, k, v = qkv.chunk(3, dim=1)  # (B, Cb, Ph, Pw//2+1) each
                o = _attend_spectra(  # Eqs. 15-16, (B, Cb, H, W)
                    q, k, v, (h, w), grid, q.shape[1] * self.num_heads // c, 1.0, self.boundary
                )
                y[:, sl] = o.flatten(2).to(odt) * t[:, sl]  # gate, (B, Cb, N)
        return self.proj_drop(_linear_cf(self.proj, y, channels_last=True))

    def _forward_dft(self, x, hw):
        """:meth:`forward` with matmul DFTs (export path, see :func:`export_mode`)."""
        return forward_dft(self, x, hw)


# the export path lives in its own file; it uses the helpers above
from .circulant_export import _circulant_attention_dft, forward_dft  # noqa: E402
