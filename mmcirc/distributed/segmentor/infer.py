"""One image predicted by P ranks and measured: the library part of
``tools/infer_highres.py --shard`` / ``--nproc P``.

* :func:`sync_weights`: rank 0's parameters and buffers to every rank (random weights
  built on P processes are otherwise P different models);
* :func:`run_image_sharded`: :func:`~.model.predict_sharded` of one image
  with the wall time (slowest rank), every rank's peak RSS (high-water mark reset before
  the image where Linux allows it) and bytes sent, gathered on every rank.
"""

import time
from typing import Sequence

import torch
import torch.distributed as dist

from mmcirc.utils.memory import peak_rss_bytes, rss_baseline

from ..comm import count_bytes, group_rank_size
from .model import ShardedSegmentor, predict_sharded

__all__ = ['run_image_sharded', 'sync_weights']

MB = 1024**2


def sync_weights(model: torch.nn.Module, group=None) -> None:
    """Broadcast rank 0's parameters and buffers (in module order) to every rank."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, 0, group=group)


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
