"""Distributed 2-D real FFT of a row-band-sharded map (slab decomposition).

Rank ``r`` of ``P`` holds the rows :func:`~mmcirc.distributed.row_split.band_bounds` ``(rows, P)[r]``
of a real map ``(..., rows, W)``; its spectrum on a grid ``(Ph, Pw) >= (rows, W)`` (zero
padded, as ``torch.fft.rfft2(x, s=grid)``) is sharded by columns: rank ``r`` holds the
``band_bounds(U, P)[r]`` frequencies of the half spectrum, ``U = Pw // 2 + 1``, for all
``Ph`` rows.

* :func:`sharded_rfft2`: real FFT along W (length Pw) on the local rows, one
  ``all_to_all_single`` to column bands, FFT along H (length Ph: the padding rows of the
  zero-padded grid belong to no rank before the transpose; after it every rank holds
  whole columns and pads them locally, so they are never sent).
* :func:`sharded_irfft2`: inverse FFT along H on the column band, kept to the first
  ``rows`` rows (only those are sent), ``all_to_all_single`` back to row bands, inverse
  real FFT along W cropped to ``width`` columns.

Communication per call, with ``s`` bytes per real element (4 float32, 8 float64) and
``L = prod(leading dims)`` (e.g. B * C): every rank sends the part of its local block
that other ranks own, ``2 s L sum_r sum_{q != r} rows_r * U_q`` bytes in all (complex
values are two reals), about ``2 s L rows U (1 - 1/P)`` (:func:`transpose_bytes`); the
forward and the inverse of the same shapes move the same bytes.

Both are differentiable: torch.fft's own backward around the transposes, whose adjoint
is the same transpose back (:func:`~mmcirc.distributed.comm.all_to_all`).

Everything goes through ``torch.distributed`` (any backend with ``all_to_all_single``:
gloo, NCCL, MPI). Without an initialised process group (or with P = 1) the functions
are the single-process FFTs.
"""

import math
from typing import Optional, Sequence

import torch

from .comm import all_to_all, empty_band, group_rank_size
from .row_split import band_bounds

__all__ = ['sharded_irfft2', 'sharded_rfft2', 'spectrum_columns', 'transpose_bytes']


def spectrum_columns(grid: Sequence[int], world_size: int):
    """``[(start, stop)]`` of each rank's half-spectrum columns on ``grid`` (Ph, Pw)."""
    return band_bounds(grid[1] // 2 + 1, world_size)


def transpose_bytes(lead: int, rows: int, grid: Sequence[int], world_size: int, real_bytes: int):
    """Bytes all ranks send in one transpose of :func:`sharded_rfft2` /
    :func:`sharded_irfft2` (``lead``: the product of the leading dims, ``rows``: the real
    map's; the formula above)."""
    hb = [b - a for a, b in band_bounds(rows, world_size)]
    ub = [b - a for a, b in spectrum_columns(grid, world_size)]
    total = sum(hb) * sum(ub) - sum(h * u for h, u in zip(hb, ub))
    return 2 * real_bytes * lead * total


def _exchange(pieces, recv_shapes, group):
    """All-to-all of complex tensors: ``pieces[q]`` goes to rank q; returns the pieces
    received from every rank q, of shapes ``recv_shapes[q]`` (one flat real buffer each
    way, uneven splits)."""
    in_split = [2 * t.numel() for t in pieces]
    send = torch.empty(sum(in_split), dtype=pieces[0].real.dtype, device=pieces[0].device)
    off = 0
    for t, n in zip(pieces, in_split):  # one copy of each piece (narrow: autograd's view)
        send.narrow(0, off, n).view(*t.shape, 2).copy_(torch.view_as_real(t))
        off += n
    out_split = [2 * torch.Size(shp).numel() for shp in recv_shapes]
    recv = all_to_all(send, out_split, in_split, group)  # differentiable
    return [
        torch.view_as_complex(t.view(*shp, 2)) for t, shp in zip(recv.split(out_split), recv_shapes)
    ]


def _transpose(z, split, join, dim, rank, group):
    """The complex band z (L, ., .) cut along ``dim`` by the bounds ``split``, part q to
    rank q; the parts received joined along the other axis, whose bounds are ``join``:
    (L, h_r, U) -> (L, rows, u_r) for ``dim`` 2, (L, rows, u_r) -> (L, h_r, U) for 1."""
    if len(split) == 1:
        return z
    other, (a, b) = 3 - dim, split[rank]
    pieces = [z.narrow(dim, c, d - c) for c, d in split]  # to rank q
    shapes = [list(z.shape) for _ in join]
    for shape, (c, d) in zip(shapes, join):
        shape[dim], shape[other] = b - a, d - c
    return torch.cat(_exchange(pieces, shapes, group), dim=other)  # ranks 0..P-1 in order


def _fft(fn, z, n, dim, norm='backward'):
    """``fn(z, n=n, dim=dim, norm=norm)``, also for an empty band (a rank without rows or
    columns, which MKL refuses): the empty output's shape and dtype, from a meta tensor
    (:func:`empty_band`)."""
    if z.numel():
        return fn(z, n=n, dim=dim, norm=norm)
    out = fn(torch.empty(z.shape, dtype=z.dtype, device='meta'), n=n, dim=dim, norm=norm)
    return empty_band(z, out.shape, out.dtype)


def _check_grid(rows, width, grid):
    if len(grid) != 2 or grid[0] < rows or grid[1] < width:
        raise ValueError(f'grid must be (Ph, Pw) >= (rows, W) = ({rows}, {width}), got {grid!r}')


def sharded_rfft2(
    x: torch.Tensor, rows: int, grid: Sequence[int], group=None, norm: str = 'backward'
) -> torch.Tensor:
    """Column band of ``torch.fft.rfft2(full, s=grid, norm=norm)`` from the row band ``x``.

    Args:
        x (Tensor): real (..., h_r, W), rows ``band_bounds(rows, P)[rank]`` of the map.
        rows (int): rows of the whole map (<= Ph).
        grid (tuple): FFT grid (Ph, Pw) >= (rows, W); the map is zero padded to it.
        group: process group (None: the default group).
        norm (str): torch.fft's normalisation (a 2-D one is that of each 1-D pass).

    Returns:
        Tensor: complex (..., Ph, u_r), the half-spectrum columns
        ``spectrum_columns(grid, P)[rank]``.
    """
    rank, size = group_rank_size(group)
    *lead, hr, w = x.shape
    _check_grid(rows, w, grid)
    rb, cb = band_bounds(rows, size), spectrum_columns(grid, size)
    if hr != rb[rank][1] - rb[rank][0]:
        raise ValueError(f'x has {hr} rows, rank {rank} of {size} owns {rb[rank]} of {rows}')
    z = _fft(torch.fft.rfft, x.reshape(math.prod(lead), hr, w), grid[1], -1, norm)  # (L, h_r, U)
    z = _transpose(z, cb, rb, 2, rank, group)  # (L, rows, u_r)
    z = _fft(torch.fft.fft, z, grid[0], -2, norm)  # zero rows rows..Ph-1: (L, Ph, u_r)
    return z.view(*lead, *z.shape[-2:])


def sharded_irfft2(
    z: torch.Tensor,
    rows: int,
    grid: Sequence[int],
    width: Optional[int] = None,
    group=None,
    norm: str = 'backward',
) -> torch.Tensor:
    """Row band of ``torch.fft.irfft2(full, s=grid, norm=norm)[..., :rows, :width]`` from
    the column band ``z``.

    Args:
        z (Tensor): complex (..., Ph, u_r), columns ``spectrum_columns(grid, P)[rank]``.
        rows (int): rows of the output map (<= Ph), split by ``band_bounds(rows, P)``.
        grid (tuple): FFT grid (Ph, Pw).
        width (int, optional): columns kept (<= Pw; None: Pw).
        group: process group (None: the default group).
        norm (str): torch.fft's normalisation.

    Returns:
        Tensor: real (..., h_r, width), rows ``band_bounds(rows, P)[rank]``.
    """
    rank, size = group_rank_size(group)
    width = grid[1] if width is None else width
    _check_grid(rows, width, grid)
    *lead, ph, ur = z.shape
    rb, cb = band_bounds(rows, size), spectrum_columns(grid, size)
    if ph != grid[0] or ur != cb[rank][1] - cb[rank][0]:
        raise ValueError(
            f'z must be (..., {grid[0]}, {cb[rank][1] - cb[rank][0]}) on rank {rank} of '
            f'{size} for grid {tuple(grid)}, got {tuple(z.shape)}'
        )
    z = _fft(torch.fft.ifft, z.reshape(math.prod(lead), ph, ur), ph, -2, norm)[:, :rows]
    z = _transpose(z, rb, cb, 1, rank, group)  # (L, h_r, U)
    x = _fft(torch.fft.irfft, z, grid[1], -1, norm)[..., :width]  # (L, h_r, width)
    return x.reshape(*lead, *x.shape[-2:])
