"""One image predicted by P ranks and measured: the library part of
``tools/infer_highres.py --shard`` / ``--nproc P``.

* :func:`sync_weights`: rank 0's parameters and buffers to every rank (random weights
  built on P processes are otherwise P different models);
* :func:`count_bytes`: a context that counts the bytes this rank hands to
  torch.distributed (point-to-point sends, ``all_to_all_single`` to other ranks,
  ``all_reduce`` / ``all_gather`` payloads);
* :func:`run_image_sharded`: :func:`~mmcirc.parallel.model.predict_sharded` of one image
  with the wall time (slowest rank), every rank's peak RSS (high-water mark reset before
  the image where Linux allows it) and bytes sent, gathered on every rank.
"""

import contextlib
import time
from typing import Sequence

import torch
import torch.distributed as dist

from mmcirc.utils.memory import peak_rss_bytes, rss_baseline
from mmcirc.distributed.comm import group_rank_size
from .model import ShardedSegmentor, predict_sharded

__all__ = ['count_bytes', 'run_image_sharded', 'sync_weights']

MB = 1024**2


def sync_weights(model: torch.nn.Module, group=None) -> None:
    """Broadcast rank 0's parameters and buffers (in module order) to every rank."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, 0, group=group)


@contextlib.contextmanager
def count_bytes():
    """Yields ``{'p2p': ..., 'all_to_all': ..., 'all_reduce': ..., 'all_gather': ...}``:
    bytes this rank sent while the context was active (payloads of the collectives)."""
    counts = dict(p2p=0, all_to_all=0, all_reduce=0, all_gather=0)
    orig = dict(
        isend=dist.isend,
        all_to_all_single=dist.all_to_all_single,
        all_reduce=dist.all_reduce,
        all_gather=dist.all_gather,
    )

    def isend(t, *a, **k):
        counts['p2p'] += t.numel() * t.element_size()
        return orig['isend'](t, *a, **k)

    def all_to_all_single(out, inp, out_split=None, in_split=None, group=None, **k):
        if in_split is not None:
            rank = group_rank_size(group)[0]
            rows = sum(in_split) - in_split[rank]
            counts['all_to_all'] += (
                rows * (inp.numel() // max(inp.shape[0], 1)) * inp.element_size()
            )
        else:
            counts['all_to_all'] += inp.numel() * inp.element_size()
        return orig['all_to_all_single'](out, inp, out_split, in_split, group=group, **k)

    def all_reduce(t, *a, **k):
        counts['all_reduce'] += t.numel() * t.element_size()
        return orig['all_reduce'](t, *a, **k)

    def all_gather(outs, t, *a, **k):
        counts['all_gather'] += t.numel() * t.element_size()
        return orig['all_gather'](outs, t, *a, **k)

    dist.isend, dist.all_to_all_single = isend, all_to_all_single
    dist.all_reduce, dist.all_gather = all_reduce, all_gather
    try:
        yield counts
    finally:
        for name, fn in orig.items():
            setattr(dist, name, fn)


def run_image_sharded(sharded: ShardedSegmentor, img, hw: Sequence[int], group=None) -> tuple:
    """(labels (H, W) int64 numpy on rank 0 / None elsewhere, record dict on every rank):
    ``time_s`` (slowest rank, from a barrier to the labels on rank 0), ``per_rank``
    [{rank, time_s, peak_rss_mb, baseline_rss_mb, peak_increase_mb, bytes_sent}]."""
    rank, size = group_rank_size(group)
    base, per_image = rss_baseline()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    with count_bytes() as sent:
        labels, _ = predict_sharded(sharded, img, hw, group)
    elapsed = time.perf_counter() - t0
    peak = max(peak_rss_bytes(), base)
    mine = dict(
        rank=rank,
        time_s=round(elapsed, 4),
        peak_rss_mb=round(peak / MB, 1),
        baseline_rss_mb=round(base / MB, 1),
        peak_increase_mb=round((peak - base) / MB, 1),
        peak_is_per_image=per_image,
        bytes_sent=dict(sent, total=sum(sent.values())),
    )
    every: list = [None] * size
    dist.all_gather_object(every, mine, group=group)
    rec = dict(
        world_size=size,
        time_s=max(r['time_s'] for r in every),
        peak_rss_mb=max(r['peak_rss_mb'] for r in every),
        peak_increase_mb=max(r['peak_increase_mb'] for r in every),
        bytes_sent=sum(r['bytes_sent']['total'] for r in every),
        per_rank=every,
        torch_threads=torch.get_num_threads(),
    )
    return (None if labels is None else labels.numpy()), rec
