"""The row exchange of band-sharded maps (halo exchange), over torch.distributed.

A map is band-sharded along one dimension (the rows, ``dim=-2`` of an NCHW map or
``dim=1`` of (B, H, W, C)): rank ``r`` holds the global rows
``[offsets[r], offsets[r + 1])``. Every row-local layer (a convolution, an
interpolation, a gather of small reduced maps) needs some contiguous range of global
rows, which may reach into the neighbours' bands or past the image, where the rows are
zeros (zero padding). :func:`exchange_rows` serves every rank's request at once with
point-to-point ``isend`` / ``irecv`` of the overlapping slices. The band layout
(:class:`Layout`, :meth:`Layout.of`) follows from the map's height and P
(:func:`~mmcirc.distributed.bands.band_bounds`), so it is computed, never gathered.

Requests (``wants``) are computed by every rank for every rank from the layout and the
layer's geometry, so a layer needs no collective besides the exchange itself.

This file depends on torch only.
"""

from typing import Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .bands import band_bounds

__all__ = [
    'Layout',
    'comm_device',
    'exchange_rows',
    'gather_rows',
    'group_rank_size',
]


def group_rank_size(group=None) -> Tuple[int, int]:
    """``(rank, world_size)`` in ``group`` (None: the default group); ``(0, 1)``
    without a process group. The one rank / size helper of :mod:`mmcirc.parallel`."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def comm_device(group=None, like: Optional[torch.Tensor] = None) -> torch.device:
    """Where the tensors handed to ``group``'s collectives live: the CUDA device of
    ``like`` (else the current one) under NCCL, the CPU otherwise (gloo)."""
    if dist.get_backend(group) != 'nccl':
        return torch.device('cpu')
    if like is not None and like.device.type == 'cuda':
        return like.device
    return torch.device('cuda', torch.cuda.current_device())


class Layout:
    """The band layout of one map: ``offsets`` (P + 1 global row indices), ``height``
    (H = offsets[-1]) and this rank's band ``(start, stop)``."""

    def __init__(self, offsets: Sequence[int], rank: int):
        self.offsets = [int(o) for o in offsets]
        self.rank = rank
        self.height = self.offsets[-1]
        self.start, self.stop = self.offsets[rank], self.offsets[rank + 1]

    @classmethod
    def of(cls, height: int, world_size: int, rank: int) -> 'Layout':
        """The layout of a map ``height`` rows high under the band rule (no collective)."""
        return cls([a for a, _ in band_bounds(height, world_size)] + [height], rank)

    @property
    def world_size(self) -> int:
        return len(self.offsets) - 1

    def band(self, q: int) -> Tuple[int, int]:
        return self.offsets[q], self.offsets[q + 1]

    def __repr__(self) -> str:
        return f'Layout(offsets={self.offsets}, rank={self.rank})'


def exchange_rows(
    x: torch.Tensor,
    layout: Layout,
    wants: Sequence[Tuple[int, int]],
    dim: int = -2,
    group=None,
) -> torch.Tensor:
    """Every rank's requested global rows of a band-sharded tensor.

    x: this rank's band (``layout.stop - layout.start`` rows along ``dim``).
    wants: ``(lo, hi)`` for every rank q (the same list on every rank), any integers
    with lo <= hi; rows outside ``[0, H)`` are zeros.
    Returns this rank's rows ``[lo, hi)`` (``hi - lo`` rows along ``dim``), contiguous.
    """
    rank, size = layout.rank, layout.world_size
    dim = dim % x.dim()
    if x.shape[dim] != layout.stop - layout.start:
        raise ValueError(
            f'x has {x.shape[dim]} rows along dim {dim}, the layout gives rank {rank} '
            f'{layout.stop - layout.start}'
        )
    lo, hi = wants[rank]
    shape = list(x.shape)
    shape[dim] = hi - lo
    out = x.new_zeros(shape)  # (..., hi - lo, ...); stays zero outside the map
    start, stop = layout.start, layout.stop
    # own rows: a local copy
    a, b = max(lo, start), min(hi, stop)
    if a < b:
        out.narrow(dim, a - lo, b - a).copy_(x.narrow(dim, a - start, b - a))
    ops, recvs = [], []
    for q in range(size):
        if q == rank:
            continue
        # what q needs from me
        qlo, qhi = wants[q]
        a, b = max(qlo, start), min(qhi, stop)
        if a < b:
            ops.append(dist.isend(x.narrow(dim, a - start, b - a).contiguous(), q, group=group))
        # what I need from q
        qs, qe = layout.band(q)
        a, b = max(lo, qs), min(hi, qe)
        if a < b and lo < hi:
            shape[dim] = b - a
            buf = x.new_empty(shape)
            ops.append(dist.irecv(buf, q, group=group))
            recvs.append((a, b, buf))
    for op in ops:
        op.wait()
    for a, b, buf in recvs:
        out.narrow(dim, a - lo, b - a).copy_(buf)
    return out


def gather_rows(
    x: torch.Tensor, layout: Layout, dim: int = -2, group=None, dst: Optional[int] = None
) -> Optional[torch.Tensor]:
    """The whole map from its bands (``layout``: theirs, e.g. :meth:`Layout.of`): on
    every rank (``dst`` None, an all-gather of uneven bands) or on rank ``dst`` only
    (others get None)."""
    dim = dim % x.dim()
    wants = [
        (0, layout.height) if dst is None or q == dst else (0, 0) for q in range(layout.world_size)
    ]
    out = exchange_rows(x, layout, wants, dim=dim, group=group)
    return out if dst is None or layout.rank == dst else None
