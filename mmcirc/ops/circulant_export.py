"""The export path of circulant attention: 2-D DFTs as real matrix products.

``torch.onnx.export`` and other tracers without complex tensors fail on ``torch.fft``;
inside :func:`mmcirc.ops.circulant.export_mode` every DFT of ``circulant_attention`` and
``CirculantAttention`` runs here instead, as two real matmuls with cos/sin matrices built
from the runtime H and W, on (real, imag) pairs of the half spectrum. Same equations as
the FFT path (METHOD.md section 1), cost O(N (H + W)) per channel.

This file depends on torch only.
"""

import contextlib
import math

import torch

from .circulant import (
    _autocast_dtype,
    _box_sums,
    _check_scale,
    _dtypes,
    _fp32_region,
    _linear_cf,
    _num_heads,
    _scale_value,
)

__all__ = ['forward_dft']


def _scale_any(scale, n, d):
    """:func:`_scale_value` that also takes a symbolic N (torch.export)."""
    if isinstance(n, int):
        return _scale_value(scale, n, d)
    _check_scale(scale)
    if scale == 'sqrt_n':
        return (n * d) ** -0.5
    if scale == 'n':
        return 1.0 / (n * math.sqrt(d))
    return float(scale)


def _dft_grid(h, w, boundary):
    """Grid of the export path: H x W, or (2H-1) x (2W-1) for 'zero'."""
    return (h, w) if boundary == 'circular' else (2 * h - 1, 2 * w - 1)


def _dft_bases(grid, dtype, device):
    """DFT matrices on ``grid`` (Ph, Pw), U = Pw//2+1 (half spectrum).

    Returns (ch, sh, cw, sw, icw, isw): cos/sin of 2 pi j k / Ph (Ph, Ph),
    of 2 pi j u / Pw (Pw, U), and the inverse's (U, Pw) with the Hermitian
    weights (1 for u = 0 and u = Pw/2, else 2) and 1/(Ph Pw). j*k is reduced
    mod P in integers, so every angle lies in [0, 2 pi). P enters as a
    tensor (the last index + 1), never as a Python scalar, so that a traced
    graph keeps it symbolic (ONNX: Range, Mod, Cos, Sin on the input size).
    """
    j = torch.arange(grid[0], device=device)  # (Ph,)
    p = j[-1:] + 1  # Ph as a (1,) tensor
    ang = (j[:, None] * j[None, :] % p).to(dtype) * (2 * math.pi) / p
    ch, sh = ang.cos(), ang.sin()  # (Ph, Ph), symmetric
    norm = p.to(dtype)  # Ph
    j = torch.arange(grid[1], device=device)  # (Pw,)
    p = j[-1:] + 1  # Pw as a (1,) tensor
    u = j[: grid[1] // 2 + 1]  # (U,)
    ang = (j[:, None] * u[None, :] % p).to(dtype) * (2 * math.pi) / p
    cw, sw = ang.cos(), ang.sin()  # (Pw, U)
    wts = (2 - (u == 0).to(dtype) - (2 * u == p).to(dtype)) / (norm * p)
    return (
        ch,
        sh,
        cw,
        sw,
        (cw * wts).transpose(0, 1),
        (sw * wts).transpose(0, 1),
    )  # ..., (U, Pw), (U, Pw)


def _dft2(x, bases, hw):
    """Half spectrum (real, imag) (..., Ph, U) of real x (..., H, W), zero
    padded to the grid of ``bases`` (rfft2 with ``s=grid``)."""
    ch, sh, cw, sw = bases[:4]
    h, w = hw
    xr, xi = x @ cw[:w], -(x @ sw[:w])  # along W: e^{-i theta} (..., H, U)
    ch, sh = ch[:, :h], sh[:, :h]  # (Ph, H)
    return ch @ xr + sh @ xi, ch @ xi - sh @ xr  # along H: (..., Ph, U)


def _idft2(yr, yi, bases, hw):
    """Real inverse of a Hermitian half spectrum (..., Ph, U) on the grid of
    ``bases``, cropped to (..., H, W) (irfft2 with ``s=grid``, cropped)."""
    ch, sh, icw, isw = bases[0], bases[1], bases[4], bases[5]
    h, w = hw
    ch, sh = ch[:h], sh[:h]  # (H, Ph)
    zr, zi = ch @ yr - sh @ yi, ch @ yi + sh @ yr  # along H: (..., H, U)
    return zr @ icw[:, :w] - zi @ isw[:, :w]  # real part along W (..., H, W)


def _attend_dft(q, k, v, hw, grid, num_heads, bases, boundary):
    """:func:`_attend_spectra` on (real, imag) pairs (B, C, Ph, U) of the
    half spectra of q, k, v (scale already in q). Returns o (B, C, H, W)."""
    (qr, qi), (kr, ki), (vr, vi) = q, k, v
    b, c = qr.shape[:2]
    d = c // num_heads
    f = qr.shape[-2:]
    # Eq. 15: FFT(a) = sum_{c in head} conj(Q_c) K_c (B, heads, Ph, U)
    ar = (qr * kr + qi * ki).reshape(b, num_heads, d, *f).sum(2)
    ai = (qr * ki - qi * kr).reshape(b, num_heads, d, *f).sum(2)
    a = _idft2(ar, ai, bases, grid)  # (B, heads, Ph, Pw)
    # 'zero': every cell of the (2H-1) x (2W-1) grid is an offset, no mask
    p = torch.softmax(a.flatten(2), dim=-1).view_as(a)  # (B, heads, Ph, Pw)
    # Eq. 16: FFT(o) = conj(P) V, per channel of the head
    pr, pi = (t.unsqueeze(2) for t in _dft2(p, bases, grid))  # (B, h, 1, ..)
    vr, vi = (t.reshape(b, num_heads, d, *f) for t in (vr, vi))
    o = _idft2(pr * vr + pi * vi, pr * vi - pi * vr, bases, hw)
    if boundary == 'zero':  # renormalise rows of A over in-map tokens
        # offsets -(H-1)..-1 sit at rows H..2H-2 of the exact grid, 0..H-1
        # at rows 0..H-1 (likewise columns): order by slicing (no roll,
        # whose symbolic shifts do not export)
        p = torch.cat([p[..., hw[0] :, :], p[..., : hw[0], :]], dim=-2)
        p = torch.cat([p[..., hw[1] :], p[..., : hw[1]]], dim=-1)
        o = o / _box_sums(p, hw).unsqueeze(2)  # (B, heads, d, H, W)
    return o.reshape(b, c, *hw)  # (B, C, H, W)


def _fp32_region_if_autocast(t):
    """:func:`_fp32_region` only under autocast: torch.export turns even a disabled
    autocast region into a ``wrap_with_autocast`` subgraph, whose symbolic sizes
    the ONNX translation mixes up."""
    if _autocast_dtype(t.device.type) is None:
        return contextlib.nullcontext()
    return _fp32_region(t)


def _circulant_attention_dft(q, k, v, boundary, num_heads, scale):
    """:func:`circulant_attention` with matmul DFTs (see :func:`export_mode`)."""
    b, h, w, c = q.shape
    heads = _num_heads(c, num_heads)
    s = _scale_any(scale, h * w, c // heads)
    grid = _dft_grid(h, w, boundary)
    cdt, odt = _dtypes(q)
    with _fp32_region_if_autocast(q):
        bases = _dft_bases(grid, cdt, q.device)
        q, k, v = (
            _dft2(t.to(cdt).permute(0, 3, 1, 2), bases, (h, w)) for t in (q, k, v)
        )  # (B, C, Ph, U) pairs
        o = _attend_dft(
            (q[0] * s, q[1] * s), k, v, (h, w), grid, heads, bases, boundary
        )  # (B, C, H, W)
    return o.permute(0, 2, 3, 1).to(odt, memory_format=torch.contiguous_format)


def forward_dft(module, x, hw):
    """:meth:`CirculantAttention.forward` with matmul DFTs (export path, see
    :func:`mmcirc.ops.circulant.export_mode`): the same steps, all heads at once."""
    b, n, c = x.shape
    grid = _dft_grid(*hw, module.boundary)
    s = _scale_any(module.scale, n, c // module.num_heads)
    cdt, odt = _dtypes(x)

    x = x.transpose(1, 2)  # (B, C, N)
    t = module.gate[1](_linear_cf(module.gate[0], x))  # Eq. 20 gate (B, C, N)
    with _fp32_region_if_autocast(x):
        bases = _dft_bases(grid, cdt, x.device)
        xr, xi = _dft2(x.to(cdt).reshape(b, c, *hw), bases, hw)
        f = xr.shape[-2:]  # (Ph, U)
        wqkv = module.qkv.weight.to(cdt)  # (3C, C): W_q (scaled by s), W_k, W_v
        wqkv = torch.cat([wqkv[:c] * s, wqkv[c:]])
        xr, xi = (
            torch.matmul(wqkv, z.reshape(b, c, -1)).reshape(b, 3 * c, *f) for z in (xr, xi)
        )  # (B, 3C, Ph, U)
        q, k, v = zip(xr.chunk(3, dim=1), xi.chunk(3, dim=1))  # pairs
        o = _attend_dft(q, k, v, hw, grid, module.num_heads, bases, module.boundary)  # (B, C, H, W)
        y = o.reshape(b, c, n).to(odt) * t  # gate, (B, C, N)
    return module.proj_drop(_linear_cf(module.proj, y, channels_last=True))
