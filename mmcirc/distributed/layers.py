"""Sharded row-local ops on a band ``x`` of a map whose rows are split as
:func:`mmcirc.distributed.row_split.band_bounds` (``layout``: a
:class:`~mmcirc.distributed.comm.Layout` from the bounds, no collective); each returns
exactly this rank's band of the single-process output (bands of the output's own
height), differentiably. The :mod:`.handlers` of
:class:`~mmcirc.distributed.banded_map.BandedMap` call them.
"""

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .comm import Layout, all_reduce_sum, empty_band, exchange_rows
from .row_split import band_bounds

__all__ = [
    'conv2d_rows',
    'conv_out_size',
    'group_norm_rows',
    'interpolate',
    'adaptive_avg_pool',
    'batch_norm_rows',
]


def _pair(v, cast=int) -> Tuple:
    return (cast(v[0]), cast(v[1])) if isinstance(v, (tuple, list)) else (cast(v), cast(v))


def conv_out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    """Output length of a convolution / pooling window along one axis."""
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _window_rows(band, k, s, p, d, shift=0):
    """Input rows ``[lo, hi)`` the output rows ``band`` of a window op read (global rows
    of the unpadded map; ``shift``: zero rows added above it)."""
    a, b = band
    if b <= a:
        return (0, 0)
    return (a * s - p - shift, (b - 1) * s - p + d * (k - 1) + 1 - shift)


def conv2d_rows(x, layout: Layout, weight, bias=None, stride=1, padding=0, dilation=1,
                groups=1, pad_rows: Sequence[int] = (0, 0), group=None) -> torch.Tensor:  # fmt: skip
    """This rank's band (B, C', h'_r, W') of ``F.conv2d`` (zero padding, int ``padding``)
    of the map whose band ``x`` (B, C, h_r, W) has the row ``layout``, with ``pad_rows``
    extra zero rows above / below: the input rows the output band reads, fetched from
    the neighbours (halo exchange), then torch's conv with no row padding."""
    (k, kw), (s, sw), (p, pw), (d, dw) = (
        tuple(weight.shape[-2:]), _pair(stride), _pair(padding), _pair(dilation),
    )  # fmt: skip
    top, bottom = int(pad_rows[0]), int(pad_rows[1])
    h_out = conv_out_size(layout.height + top + bottom, k, s, p, d)
    bands = band_bounds(h_out, layout.world_size)
    wants = [_window_rows(b, k, s, p, d, shift=top) for b in bands]
    rows = exchange_rows(x, layout, wants, dim=-2, group=group)  # (B, C, n, W)
    a, b = bands[layout.rank]
    if b <= a:  # an empty band (a map with fewer rows than ranks)
        w_out = conv_out_size(x.shape[-1], kw, sw, pw, dw)
        return empty_band(rows, (x.shape[0], weight.shape[0], 0, w_out))
    return F.conv2d(rows, weight, bias, (s, sw), (0, pw), (d, dw), groups)  # (B, C', h'_r, W')


# --------------------------------------------------------------------------- interpolation
def _source_rows(a, b, in_h, out_h, mode, align_corners, scale_factor, dtype):
    """torch's source rows and weights of the output rows [a, b) (``scale_factor``: float
    or None): nearest -> (i0,), bilinear -> (i0, i1, w0, w1); int64 / ``dtype`` (b - a,)."""
    if mode == 'nearest':
        if out_h == in_h:
            return (torch.arange(a, b),)
        if out_h == 2 * in_h:
            return (torch.arange(a, b) // 2,)
        if scale_factor:  # torch computes the nearest index in float
            scale = torch.tensor(1.0 / scale_factor, dtype=torch.float32)
        else:
            scale = torch.tensor(in_h, dtype=torch.float32) / out_h
        idx = (torch.arange(a, b, dtype=torch.float32) * scale).floor().long()
        return (idx.clamp(max=in_h - 1),)
    dst = torch.arange(a, b, dtype=dtype)
    if align_corners:
        scale = (in_h - 1) / (out_h - 1) if out_h > 1 else 0.0
        src = torch.tensor(scale, dtype=dtype) * dst
    else:
        if scale_factor:
            scale = torch.tensor(1.0 / scale_factor, dtype=dtype)
        else:
            scale = torch.tensor(in_h, dtype=dtype) / out_h
        src = (scale * (dst + 0.5) - 0.5).clamp(min=0)
    i0 = src.long()  # truncation (src >= 0)
    i1 = i0 + (i0 < in_h - 1).long()
    w1 = src - i0.to(dtype)
    return i0, i1, 1 - w1, w1


def _interp_cols(x, mode, align_corners, w_size, w_scale):
    """torch's interpolation of the columns only (rows unchanged, scale 1 exactly)."""
    ac = align_corners if mode == 'bilinear' else None
    if w_scale is not None:
        return F.interpolate(x, scale_factor=(1.0, w_scale), mode=mode, align_corners=ac)
    return F.interpolate(x, size=(x.shape[-2], w_size), mode=mode, align_corners=ac)


def _interp_band(rows, row0, in_h, out_band, out_h, mode, align_corners, h_scale, w_size, w_scale):
    """Output rows ``out_band`` from the input rows ``[row0, row0 + rows.shape[-2])``:
    the rows (torch's source rows and weights) on the input width first, then the
    columns (torch's own interpolation, rows unchanged): one pass at the output size."""
    a, b = out_band
    if b <= a or rows.shape[-2] == 0:  # an empty band
        w_out = int(w_size) if w_size is not None else int(rows.shape[-1] * w_scale)
        return empty_band(rows, (*rows.shape[:-2], 0, w_out))
    src = _source_rows(a, b, in_h, out_h, mode, align_corners, h_scale, rows.dtype)
    if mode == 'nearest':
        banded = rows.index_select(-2, src[0] - row0)  # (B, C, b - a, W)
    else:
        i0, i1, w0, w1 = src
        banded = rows.index_select(-2, i0 - row0) * w0.view(-1, 1)
        banded += rows.index_select(-2, i1 - row0) * w1.view(-1, 1)  # (B, C, b - a, W)
    return _interp_cols(banded, mode, align_corners, w_size, w_scale)  # (B, C, b - a, W')


def _needed(band, in_h, out_h, mode, align_corners, h_scale):
    a, b = band
    if b <= a:
        return (0, 0)
    src = _source_rows(a, b, in_h, out_h, mode, align_corners, h_scale, torch.float64)
    last = src[1] if mode == 'bilinear' else src[0]
    return int(src[0].min()), int(last.max()) + 1


def interpolate(
    x: torch.Tensor,
    size: Optional[Sequence[int]] = None,
    scale_factor=None,
    mode: str = 'nearest',
    align_corners: Optional[bool] = None,
    group=None,
    *,
    in_layout: Layout,
) -> torch.Tensor:
    """This rank's band of ``F.interpolate(full, size, scale_factor, mode,
    align_corners)`` from its band ``x`` (B, C, h_r, W) of the rows ``in_layout``.
    ``size``: the global (H', W'). The source rows the band needs come from the
    neighbours."""
    if mode not in ('nearest', 'bilinear'):
        raise ValueError(
            f"sharded interpolation: mode must be 'nearest' or 'bilinear', got {mode!r}"
        )
    align_corners = bool(align_corners) if mode == 'bilinear' else False
    hs, ws = (None, None) if scale_factor is None else _pair(scale_factor, float)
    in_h = in_layout.height
    out_h = int(in_h * hs) if size is None else int(size[0])
    w_size = None if size is None else int(size[1])
    bands = band_bounds(out_h, in_layout.world_size)
    wants = [_needed(b, in_h, out_h, mode, align_corners, hs) for b in bands]
    rows = exchange_rows(x, in_layout, wants, group=group)
    return _interp_band(
        rows, wants[in_layout.rank][0], in_h, bands[in_layout.rank], out_h, mode,
        align_corners, hs, w_size, ws,
    )  # fmt: skip


# --------------------------------------------------------------------------- pooling
def adaptive_avg_pool(x: torch.Tensor, output_size, layout: Layout, group=None) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(full, output_size)`` on every rank from the bands ``x``
    (B, C, h_r, W): per output row cell [floor(iH/o), ceil((i+1)H/o)) the local rows'
    sums, ``all_reduce``, then the column cells (torch's own, on o x W)."""
    oh, ow = _pair(output_size) if not isinstance(output_size, int) else (output_size,) * 2
    ow = x.shape[-1] if ow is None else ow
    h = layout.height
    sums = x.new_zeros(x.shape[0], x.shape[1], oh, x.shape[-1])  # (B, C, oh, W)
    counts = []
    for i in range(oh):
        lo, hi = (i * h) // oh, -((-(i + 1) * h) // oh)
        counts.append(hi - lo)
        a, b = max(lo, layout.start), min(hi, layout.stop)
        if a < b:
            sums[:, :, i] = x[:, :, a - layout.start : b - layout.start].sum(dim=2)
    sums = all_reduce_sum(sums, group)
    rows = sums / torch.tensor(counts, dtype=x.dtype, device=x.device).view(-1, 1)
    return F.adaptive_avg_pool2d(rows, (oh, ow))  # rows: identity; columns: torch's cells


# --------------------------------------------------------------------------- norms
def _moments(t, dims, group):
    """Mean and biased variance of ``t`` over ``dims`` (keepdim) and over every rank's
    band, and the count of the values they average (a 0-d tensor): the sums and counts by
    one ``all_reduce``, the centred sum of squares by a second (exact, no cancellation);
    differentiable."""
    s = t.sum(dims, keepdim=True)
    n = t.new_full((1,) * t.dim(), t.numel() / max(s.numel(), 1))  # values per statistic
    stats = all_reduce_sum(torch.cat([s.reshape(-1), n.reshape(-1)]), group)  # (S..., N)
    count = stats[-1]
    mean = (stats[:-1] / count).view_as(s)
    var = all_reduce_sum(((t - mean) ** 2).sum(dims, keepdim=True), group) / count
    return mean, var, count


def _affine(y, weight, bias):
    shape = (1, y.shape[1]) + (1,) * (y.dim() - 2)
    if weight is not None:
        y = y * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    return y


def group_norm_rows(x, num_groups, weight=None, bias=None, eps=1e-5, group=None):
    """``F.group_norm`` of a band-sharded (B, C, h_r, W) map: the group mean and the
    (biased) variance over all ranks' rows by ``all_reduce`` sums; differentiable."""
    b = x.shape[0]
    g = x.reshape(b, num_groups, -1)  # (B, G, C/G * h_r * W)
    mean, var, _ = _moments(g, (-1,), group)  # (B, G, 1)
    y = ((g - mean) / torch.sqrt(var + eps)).reshape_as(x)  # (B, C, h_r, W)
    return _affine(y, weight, bias)


def batch_norm_rows(x, running_mean=None, running_var=None, weight=None, bias=None,
                    momentum=0.1, eps=1e-5, group=None):  # fmt: skip
    """``F.batch_norm`` in training of a band-sharded map x (B, C, ...) (rows on any axis
    but the channels): the per-channel mean and biased variance over the batch and every
    rank's band (SyncBN over the spatial group), differentiable; the running statistics
    (given) updated in place as torch does (unbiased variance), the same on every rank."""
    dims = [0] + list(range(2, x.dim()))
    mean, var, count = _moments(x, dims, group)  # (1, C, 1, ...)
    if running_mean is not None or running_var is not None:
        with torch.no_grad():
            m = float(momentum)
            if running_mean is not None:
                running_mean.mul_(1 - m).add_(mean.flatten().to(running_mean.dtype), alpha=m)
            if running_var is not None:
                unbiased = var.flatten() * (count / (count - 1))
                running_var.mul_(1 - m).add_(unbiased.to(running_var.dtype), alpha=m)
    return _affine((x - mean) / torch.sqrt(var + eps), weight, bias)
