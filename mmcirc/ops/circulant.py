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
autocast disabled; the result is cast back to the autocast / input dtype. Under
autocast the gate and output projection run in the autocast dtype (bf16 on the
CPU), and so does the qkv product on the float32 spectrum under bf16.

One body of the equations (:func:`_attend`) for both backends of the 2-D
transforms (:mod:`mmcirc.ops.circulant_transforms`: torch.fft, or real matmul
DFTs with symbolic sizes inside :func:`export_mode`).

This file depends on torch only.
"""

import contextlib
import math
from numbers import Real

import torch
from torch import nn

from .circulant_transforms import (
    BOUNDARIES,
    FFT_IMPLS,
    TorchFFT,
    check_choice,
    export_mode,
    fft_grid,
    get_fft_impl,
    next_fast_len,
    set_fft_impl,
    transforms,
)

__all__ = [
    'BOUNDARIES',
    'FFT_IMPLS',
    'SCALES',
    'autocast_dtype',
    'check_scale',
    'CirculantAttention',
    'circulant_attention',
    'compute_dtypes',
    'export_mode',
    'fft_grid',
    'fp32_region',
    'get_fft_impl',
    'head_blocks',
    'linear_cf',
    'next_fast_len',
    'scale_value',
    'set_fft_impl',
]

SCALES = ('sqrt_n', 'n')


# ----------------------------------------------------------------- helpers
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


def check_scale(scale):
    """The one check of a circulant ``scale``: ``'sqrt_n'``, ``'n'`` or a positive finite
    float (ValueError otherwise)."""
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


def scale_value(scale, n, d):
    """s for N = n real tokens and head width d (METHOD.md, 'Scale'); ``n`` may be a
    symbolic size (torch.export)."""
    check_scale(scale)
    if scale == 'sqrt_n':  # official code (d = 1: 1/sqrt(N))
        return 1.0 / math.sqrt(n * d) if isinstance(n, int) else (n * d) ** -0.5
    if scale == 'n':
        return 1.0 / (n * math.sqrt(d))  # paper Eq. 15, resolution invariant
    return float(scale)


def autocast_dtype(device_type):
    """The autocast dtype active for ``device_type``, or None (also for a device
    without autocast, e.g. ``meta``)."""
    if device_type == 'meta':
        return None  # shapes only: torch has no autocast state for it
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4: per-device functions
        if device_type == 'cuda' and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if device_type == 'cpu' and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
    return None


def compute_dtypes(t):
    """(compute dtype, output dtype) for an input tensor ``t``."""
    if t.dtype == torch.float64:
        return torch.float64, torch.float64
    return torch.float32, autocast_dtype(t.device.type) or t.dtype


def fp32_region(t):
    """Context with autocast off on ``t``'s device (FFTs need fp32): a no-op when
    autocast is off already (torch.export turns even a disabled autocast region into a
    ``wrap_with_autocast`` subgraph, whose symbolic sizes the ONNX translation mixes up)."""
    if autocast_dtype(t.device.type) is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=t.device.type, enabled=False)


def transpose_tokens(x, dtype=None):
    """Contiguous ``x.transpose(1, 2)`` of x (B, P, Q) -> (B, Q, P), cast to ``dtype``.

    On the CPU one 2-D transpose per batch element, after the cast: torch's ``copy_``
    has a blocked kernel for a 2-D transpose within one dtype only, and the 3-D transpose
    copy is several times slower. Beware that
    ``x.transpose(1, 2).to(memory_format=torch.contiguous_format)`` copies nothing for a
    3-D tensor (torch aliases it), and an FFT over such a strided view is far slower.
    Other devices, and symbolic batch sizes (torch.export), take the plain copy.
    """
    x = x if dtype is None else x.to(dtype)  # elementwise on the contiguous layout
    b, p, q = x.shape
    if x.device.type != 'cpu' or not isinstance(b, int):
        return x.transpose(1, 2).contiguous()
    out = x.new_empty(b, q, p)  # (B, Q, P)
    for i in range(b):
        out[i].copy_(x[i].t())  # (Q, P) <- (P, Q)^T
    return out


def _mask_padding(a, hw):
    """In place: -inf on the cells of the score maps a (..., Ph, Pw) that are no offset
    in [-(H-1), H-1] x [-(W-1), W-1] (index m >= 0 at m, m < 0 at P + m): rows
    H..Ph-H and columns W..Pw-W, a thin band of a grid rounded up to a fast length
    (symmetric under m -> -m, so the same band for the flipped scores a[-m])."""
    (h, w), (ph, pw) = hw, a.shape[-2:]
    a[..., h : ph - h + 1, :] = float('-inf')
    a[..., w : pw - w + 1] = float('-inf')
    return a


def _row_mass(p, hw):
    """Z[i] = sum_m p[-m] [i + m inside the map], (..., H, W), from the flipped
    p[-m] (..., Ph, Pw) on the wrapped grid (the layout :func:`_attend` keeps), as box
    sums of two cumulative sums along contiguous last axes (torch's CPU cumsum along a
    non-last axis is far slower).

    Column c admits the column offsets -c..W-1-c, i.e. the flipped offsets c-(W-1)..c:
    columns 0..c and Pw-(W-1-c)..Pw-1 of the grid, so with C the inclusive cumulative
    sum over columns the column sum is C[c] + C[Pw-1] - C[Pw-W+c]; likewise the rows.
    """
    h, w = hw
    ph, pw = p.shape[-2:]
    c = p.cumsum(-1)  # (..., Ph, Pw)
    s = c[..., :w] + c[..., pw - 1 :] - c[..., pw - w :]  # (..., Ph, W)
    c = s.transpose(-1, -2).contiguous().cumsum(-1)  # (..., W, Ph)
    z = c[..., :h] + c[..., ph - 1 :] - c[..., ph - h :]  # (..., W, H)
    return z.transpose(-1, -2).contiguous()  # (..., H, W)


BLOCK_BYTES = 1 << 23  # CPU: spectra of one block of heads ~8 MiB (cache)
CUDA_BLOCK_BYTES = 1 << 26  # CUDA: ~64 MiB (few launches, bounded memory)
#: at most this many blocks: each block's qkv product reads the spectrum of all C
#: input channels, so n blocks read it n times (512^2, C = 96: 48 cache-sized blocks
#: of 2 heads made that product ~36 % of the layer, re-reading 101 MB per block)
MAX_HEAD_BLOCKS = 8


def head_blocks(channels, num_heads, grid, batch=1, device_type='cpu'):
    """Channel slices of whole heads, each block's q/k/v spectra about
    BLOCK_BYTES (CUDA: CUDA_BLOCK_BYTES), and at most MAX_HEAD_BLOCKS blocks.

    Heads are independent. On the CPU, blocks keep every FFT and product in
    cache (one large batch of FFTs runs several times slower); on a GPU,
    small blocks only multiply kernel launches, so blocks there are large and
    only bound the temporary memory. On maps whose heads do not fit the budget
    (a 512 x 512 map's spectra are 1 MiB per channel) the blocks grow instead to
    a MAX_HEAD_BLOCKS-th of the heads: nothing fits the cache there, and every
    block re-reads the whole input spectrum for its qkv product.
    """
    d = channels // num_heads
    per_head = 3 * batch * d * grid[0] * (grid[1] // 2 + 1) * 8  # q, k, v
    budget = CUDA_BLOCK_BYTES if device_type == 'cuda' else BLOCK_BYTES
    heads = max(1, min(num_heads, budget // per_head), -(-num_heads // MAX_HEAD_BLOCKS))
    step = d * heads
    return [slice(i, min(i + step, channels)) for i in range(0, channels, step)]


def _blocks(tf, channels, num_heads, batch, device_type):
    """:func:`head_blocks` on the grid of the transforms ``tf``; one block when its
    sizes are symbolic (export: no Python decision on them)."""
    if tf.symbolic:
        return [slice(0, channels)]
    return head_blocks(channels, num_heads, tf.grid, batch, device_type)


def _attend(tf, q, k, v, hw, d, boundary):
    """Eq. 15, softmax, Eq. 16 from the spectra (B, C, Ph, U) of q (scale included), k,
    v on the grid of the transforms ``tf``, heads of d channels. Returns o (B, C, H, W)."""
    b, c = q.shape[:2]
    # Eq. 15 at the negated offsets, a'[m] = a[-m]: FFT(a') = sum_{c in head} Q_c conj(K_c)
    # (a softmax over all offsets does not care about their order, and FFT(p') = conj(P)
    # is Eq. 16's factor as it stands: one conj copy less)
    a = tf.irfft2(tf.corr(q, k, d), tf.grid)  # a' (B, heads, Ph, Pw)
    if tf.padded:  # 'zero', grid rounded up: softmax only over the true offsets
        # (Z would cancel the padding's share anyway; the mask keeps the softmax max
        # over real offsets, so their p cannot underflow)
        a = _mask_padding(a, hw)
    p = torch.softmax(a.flatten(2), dim=-1).view_as(a)  # p' = p[-m] (B, heads, Ph, Pw)
    # Eq. 16: FFT(o) = conj(P) V = FFT(p') V, per channel of the head
    o = tf.irfft2(tf.apply(tf.rfft2(p), v, d), hw)  # (B, C, H, W)
    if boundary == 'zero':  # renormalise rows of A over in-map tokens
        z = _row_mass(p, hw).unsqueeze(2)  # (B, heads, 1, H, W)
        o = (o.view(b, -1, d, *hw) / z).view(b, c, *hw)  # (B, C, H, W)
    return o


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
    check_choice('boundary', boundary, BOUNDARIES)
    b, h, w, c = q.shape
    heads = _num_heads(c, num_heads)
    d = c // heads
    s = scale_value(scale, h * w, d)
    cdt, odt = compute_dtypes(q)
    with fp32_region(q):
        tf = transforms((h, w), boundary, cdt, q.device)
        # (B, H, W, C) -> (B, C, H, W) contiguous: FFTs over contiguous last axes
        q, k, v = (
            transpose_tokens(t.reshape(b, h * w, c), cdt).view(b, c, h, w) for t in (q, k, v)
        )
        o = []
        for sl in _blocks(tf, c, heads, b, q.device.type):  # whole heads
            qb, kb, vb = (tf.rfft2(t[:, sl]) for t in (q, k, v))  # (B, Cb, Ph, U) each
            o.append(_attend(tf, qb * s, kb, vb, (h, w), d, boundary))  # (B, Cb, H, W)
        o = o[0] if len(o) == 1 else torch.cat(o, dim=1)  # (B, C, H, W)
    return transpose_tokens(o.reshape(b, c, h * w), odt).view(b, h, w, c)  # (B, H, W, C)


# ----------------------------------------------------------------- module
def linear_cf(layer, x, channels_last=False):
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
    the tokens are transposed once to channels first (the layout of the FFTs),
    the gate runs on that layout and the output projection reads it as a
    transposed operand.

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
        check_choice('boundary', boundary, BOUNDARIES)
        check_scale(scale)
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
        d = c // self.num_heads
        s = scale_value(self.scale, n, d)
        cdt, odt = compute_dtypes(x)
        # the qkv product on the spectrum in bf16 when the layer's output is (autocast):
        # a linear like the gate and proj; bf16 has float32's range (fp16 could overflow
        # on the spectrum's DC term, ~N times a token), the FFTs stay float32
        ldt = torch.bfloat16 if odt == torch.bfloat16 else None

        x = transpose_tokens(x)  # (B, C, N) contiguous: channels first from here on
        t = self.gate[1](linear_cf(self.gate[0], x))  # Eq. 20 gate (B, C, N)
        with fp32_region(x):
            tf = transforms((h, w), self.boundary, cdt, x.device)
            wqkv = self.qkv.weight.to(cdt).view(3, c, c)  # W_q, W_k, W_v
            # FFT(x W) = FFT(x) W: a real weight commutes with the FFT, and
            # with the zero padding of boundary='zero' (grid > H x W)
            x = tf.operand(tf.rfft2(x.to(cdt).view(b, c, h, w)), ldt)  # (B, C, Ph, U[, 2])
            y = []
            for sl in _blocks(tf, c, self.num_heads, b, x.device.type):  # whole heads
                # rows of W_q (scaled by s: Eq. 15's scale for free), W_k, W_v
                wb = torch.cat([wqkv[0, sl] * s, wqkv[1, sl], wqkv[2, sl]])
                q, k, v = tf.linear(wb, x, cdt).chunk(3, dim=1)  # (B, Cb, Ph, U) each
                o = _attend(tf, q, k, v, (h, w), d, self.boundary)  # Eqs. 15-16 (B, Cb, H, W)
                y.append(o.reshape(b, -1, n).to(odt) * t[:, sl])  # gate, (B, Cb, N)
            y = y[0] if len(y) == 1 else torch.cat(y, dim=1)  # (B, C, N)
        return self.proj_drop(linear_cf(self.proj, y, channels_last=True))
