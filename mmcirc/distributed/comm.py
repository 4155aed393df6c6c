"""The row exchange of band-sharded maps (halo exchange), over torch.distributed.

A map is band-sharded along one dimension (the rows, ``dim=-2`` of an NCHW map or
``dim=1`` of (B, H, W, C)) over a process group (its ranks numbered in the group:
:func:`data_space_mesh` makes spatial groups of a world): rank ``r`` holds the global rows
``[offsets[r], offsets[r + 1])``. Every row-local layer (a convolution, an
interpolation, a gather of small reduced maps) needs some contiguous range of global
rows, which may reach into the neighbours' bands or past the image, where the rows are
zeros (zero padding). :func:`exchange_rows` serves every rank's request at once with
point-to-point ``isend`` / ``irecv`` of the overlapping slices. The band layout
(:class:`Layout`, :meth:`Layout.of`) follows from the map's height and P
(:func:`~mmcirc.distributed.row_split.band_bounds`), so it is computed, never gathered.

Requests (``wants``) are computed by every rank for every rank from the layout and the
layer's geometry, so a layer needs no collective besides the exchange itself.

Backward: every collective here is differentiable. The global loss is the sum of the
ranks' local losses, L = sum_r L_r (a replicated output's term counted once in all), and
each rank runs ``backward`` on its own L_r; the adjoint collectives make every rank's
gradient of a band the gradient of L (each function says its adjoint). Under grad mode
each of them records its backward on every rank, also where the local operand holds no
data or depends on no parameter (an empty band): the backward collectives pair up on
all ranks. A parameter's ``.grad`` on rank r is then dL_r / dtheta, its part of
dL / dtheta: summed over the group it is the gradient of L (None on a rank whose band
never reached the parameter, e.g. an output band with no rows, which the models' row
checks exclude: it counts as zero). A replicated output (a pooled map, VECA's cores)
must enter every rank's L_r (as its share, e.g. 1/P of its term): a rank that leaves it
out would not run the adjoint its peers wait for.

:func:`count_bytes` counts what this rank hands to torch.distributed.
"""

import contextlib
from typing import Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .row_split import band_bounds

__all__ = [
    'Layout',
    'all_reduce_sum',
    'all_to_all',
    'check_shard_size',
    'comm_device',
    'count_bytes',
    'data_rank',
    'data_space_mesh',
    'empty_band',
    'exchange_rows',
    'gather_rows',
    'group_rank_size',
]


def group_rank_size(group=None) -> Tuple[int, int]:
    """``(rank, world_size)`` in ``group`` (None: the default group); ``(0, 1)``
    without a process group. The one rank / size helper of :mod:`mmcirc.distributed`."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def check_shard_size(shard_size: Optional[int], world_size: int) -> int:
    """The ranks of one spatial group: ``shard_size`` (None: all ``world_size``), else a
    one-line ValueError naming the divisors of the world size it may be."""
    if shard_size is None:
        return world_size
    positive = isinstance(shard_size, int) and not isinstance(shard_size, bool) and shard_size > 0
    if not positive or world_size % shard_size:
        divisors = tuple(s for s in range(1, world_size + 1) if world_size % s == 0)
        raise ValueError(
            f'shard_size must divide the world size {world_size} (one of {divisors}), '
            f'got {shard_size!r}'
        )
    return shard_size


def data_space_mesh(shard_size: Optional[int] = None):
    """The world as W / S data-parallel groups of S = ``shard_size`` spatial ranks:
    torch's ``DeviceMesh`` (W / S, S) with dims ``('data', 'space')`` on
    :func:`comm_device`'s device type, world rank d * S + s at (d, s) (a spatial group is
    a run of consecutive ranks: one node's where S divides the ranks per node); None
    where S = W (None, the default: the whole world is one spatial group). Every rank
    calls it together (it creates the groups); :func:`check_shard_size`'s ValueError
    before any group is made."""
    world = group_rank_size()[1]
    size = check_shard_size(shard_size, world)
    if size == world:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(
        comm_device().type, (world // size, size), mesh_dim_names=('data', 'space')
    )


def data_rank(shard_size: Optional[int] = None) -> Tuple[int, int]:
    """(this process's data-parallel rank, the number of data-parallel groups) on
    :func:`data_space_mesh`'s mesh: (world rank // S, W // S); (0, 1) for None (the
    world is one group); :func:`check_shard_size`'s ValueError."""
    rank, world = group_rank_size()
    size = check_shard_size(shard_size, world)
    return rank // size, world // size


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


def _recorded(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the operand of a differentiable collective: under grad mode a floating
    ``t`` that requires no gradient (an empty band, a constant) becomes a leaf that
    does, so that every rank records the collective and runs its adjoint in backward
    (the ranks' backward collectives pair up); otherwise ``t`` itself."""
    if (
        torch.is_grad_enabled()
        and not t.requires_grad
        and (t.is_floating_point() or t.is_complex())
    ):
        return t.detach().requires_grad_()
    return t


def empty_band(src: torch.Tensor, shape, dtype=None) -> torch.Tensor:
    """A zero-size tensor of ``shape`` (``dtype``: src's) that depends on ``src`` in
    autograd: the result of an op on an empty band, kept in the rank's graph so that
    the rank still runs the adjoints of the collectives before it (its peers may send
    it gradients of rows it owns)."""
    out = src.reshape(-1)[:0]
    out = out if dtype is None or dtype == out.dtype else out.to(dtype)
    return out.reshape(shape)


class _RowExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layout, wants, dim, group):
        bands = [layout.band(q) for q in range(layout.world_size)]
        ctx.args = (wants, bands, layout.rank, dim, group, True)
        return _move_rows(x, bands, wants, layout.rank, dim, group, False)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return (_move_rows(g, *ctx.args), None, None, None, None)


def exchange_rows(
    x: torch.Tensor, layout: Layout, wants: Sequence[Tuple[int, int]], dim: int = -2, group=None
) -> torch.Tensor:
    """Every rank's requested global rows of a band-sharded tensor.

    x: this rank's band (``layout.stop - layout.start`` rows along ``dim``).
    wants: ``(lo, hi)`` for every rank q (the same list on every rank), any integers
    with lo <= hi; rows outside ``[0, H)`` are zeros.
    Returns this rank's rows ``[lo, hi)`` (``hi - lo`` rows along ``dim``), contiguous.
    Differentiable: backward returns each requested row's gradient to the rank that
    owns the row (summed there over every rank that requested it; past the map: dropped).
    """
    dim = dim % x.dim()
    if x.shape[dim] != layout.stop - layout.start:
        raise ValueError(
            f'x has {x.shape[dim]} rows along dim {dim}, the layout gives rank {layout.rank} '
            f'{layout.stop - layout.start}'
        )
    wants = [(int(lo), int(hi)) for lo, hi in wants]
    return _RowExchange.apply(_recorded(x), layout, wants, dim, group)


def _move_rows(x, holds, needs, rank: int, dim: int, group, add: bool) -> torch.Tensor:
    """The rows ``needs[rank]`` along ``dim`` (no autograd) from x, rows ``holds[rank]``,
    and the other ranks' ``holds[q]``: each rank q sends the rows of its holding that
    ``needs[r]`` asks for to r; rows nobody holds are zeros. ``add``: a row held by
    several ranks is their sum (the adjoint, ``holds``: the requests, ``needs``: the
    bands), else its one owner's copy."""
    (lo, hi), (start, stop) = needs[rank], holds[rank]
    shape = list(x.shape)
    shape[dim] = hi - lo
    out = x.new_zeros(shape)  # (..., hi - lo, ...)
    put = torch.Tensor.add_ if add else torch.Tensor.copy_
    a, b = max(lo, start), min(hi, stop)
    if a < b:  # own rows: local
        put(out.narrow(dim, a - lo, b - a), x.narrow(dim, a - start, b - a))
    ops, recvs = [], []
    for q in range(len(holds)):
        if q == rank:
            continue
        a, b = max(needs[q][0], start), min(needs[q][1], stop)  # what q needs from me
        if a < b:
            part = x.narrow(dim, a - start, b - a).contiguous()
            ops.append(dist.isend(part, group=group, group_dst=q))
        a, b = max(lo, holds[q][0]), min(hi, holds[q][1])  # what I need from q
        if a < b:
            shape[dim] = b - a
            buf = x.new_empty(shape)
            ops.append(dist.irecv(buf, group=group, group_src=q))
            recvs.append((a, b, buf))
    for op in ops:
        op.wait()
    for a, b, buf in recvs:
        put(out.narrow(dim, a - lo, b - a), buf)
    return out


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        out = t.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        return all_reduce_sum(g, ctx.group), None


def all_reduce_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """The sum of ``t`` over the ranks of ``group`` (a new tensor, the same on every
    rank); differentiable (backward: the sum of the ranks' gradients). ``t`` itself
    without a process group or with one rank."""
    if group_rank_size(group)[1] == 1:
        return t
    return _AllReduceSum.apply(_recorded(t), group)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, send, out_split, in_split, group):
        ctx.args = (in_split, out_split, group)  # the adjoint: splits swapped
        recv = send.new_empty(sum(out_split))
        dist.all_to_all_single(recv, send, out_split, in_split, group=group)
        return recv

    @staticmethod
    def backward(ctx, g):
        return (all_to_all(g.contiguous(), *ctx.args), None, None, None)


def all_to_all(send: torch.Tensor, out_split, in_split, group=None) -> torch.Tensor:
    """``dist.all_to_all_single`` of the flat buffer ``send`` (``in_split[q]`` elements
    to rank q) into a new flat buffer (``out_split[q]`` from rank q); differentiable
    (backward: the same exchange of the gradients with the splits swapped)."""
    return _AllToAll.apply(_recorded(send), list(out_split), list(in_split), group)


def gather_rows(
    x: torch.Tensor, layout: Layout, dim: int = -2, group=None, dst: Optional[int] = None
) -> Optional[torch.Tensor]:
    """The whole map from its bands (``layout``: theirs, e.g. :meth:`Layout.of`): on
    every rank (``dst`` None, an all-gather of uneven bands; differentiable) or on rank
    ``dst`` only (others get None; no backward)."""
    dim = dim % x.dim()
    if dst is not None and torch.is_grad_enabled() and x.requires_grad:
        raise ValueError(
            f'gather_rows: dst={dst} has no backward (the other ranks get None); pass a '
            'detached tensor or dst=None'
        )
    wants = [
        (0, layout.height) if dst is None or q == dst else (0, 0) for q in range(layout.world_size)
    ]
    with torch.no_grad() if dst is not None else contextlib.nullcontext():
        out = exchange_rows(x, layout, wants, dim=dim, group=group)
    return out if dst is None or layout.rank == dst else None


@contextlib.contextmanager
def count_bytes():
    """Yields ``{'p2p': ..., 'all_to_all': ..., 'all_reduce': ..., 'all_gather': ...}``:
    the bytes this rank hands to torch.distributed while the context is active
    (point-to-point sends, ``all_to_all_single`` to the other ranks, the payloads of
    ``all_reduce`` / ``all_gather``)."""
    counts = dict(p2p=0, all_to_all=0, all_reduce=0, all_gather=0)
    orig = {n: getattr(dist, n) for n in ('isend', 'all_to_all_single', 'all_reduce', 'all_gather')}

    def size(t):
        return t.numel() * t.element_size()

    def counted(name, key, sent):
        def call(*a, **k):
            counts[key] += sent(*a, **k)
            return orig[name](*a, **k)

        return call

    def to_others(out, inp, out_split=None, in_split=None, group=None, **k):
        if in_split is None:
            return size(inp)
        rows = sum(in_split) - in_split[group_rank_size(group)[0]]
        return rows * (inp.numel() // max(inp.shape[0], 1)) * inp.element_size()

    dist.isend = counted('isend', 'p2p', lambda t, *a, **k: size(t))
    dist.all_to_all_single = counted('all_to_all_single', 'all_to_all', to_others)
    dist.all_reduce = counted('all_reduce', 'all_reduce', lambda t, *a, **k: size(t))
    dist.all_gather = counted('all_gather', 'all_gather', lambda o, t, *a, **k: size(t))
    try:
        yield counts
    finally:
        for name, fn in orig.items():
            setattr(dist, name, fn)
