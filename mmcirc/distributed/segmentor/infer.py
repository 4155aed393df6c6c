"""One image predicted by P ranks and measured: the library part of
``tools/infer_highres.py --shard`` / ``--nproc P``: :func:`sync_weights` (random weights
built on P processes are otherwise P different models), :func:`run_image_sharded` (one
image, its wall time, every rank's peak RSS and bytes sent), :func:`share_images`.
"""

import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from mmcirc.utils.memory import peak_rss_bytes, rss_baseline

from ..comm import count_bytes, data_rank, group_rank_size
from .model import ShardedSegmentor, predict_sharded

__all__ = ['run_image_sharded', 'share_images', 'sync_weights']

MB = 1024**2


def sync_weights(model: torch.nn.Module, group=None) -> None:
    """Broadcast the parameters and buffers (in module order) of ``group``'s rank 0 to
    every rank of it."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, group=group, group_src=0)


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


def share_images(
    images: Optional[List], shapes: Sequence[Sequence[int]], shard_size: Optional[int] = None
) -> Dict[int, object]:
    """World rank 0's ``images`` ((H, W, 3) uint8 arrays; None elsewhere) of sizes
    ``shapes`` (known to every rank), image k to data group k mod G of the mesh of
    ``shard_size`` ranks per spatial group (:func:`~mmcirc.distributed.comm.data_rank`):
    ``{k: image}`` of this rank's group on its first rank (rank 0 keeps its own group's,
    the others' go to theirs point-to-point), ``{}`` on the other ranks."""
    rank, world = group_rank_size()
    d, groups = data_rank(shard_size)
    first = d * (world // groups)  # the world rank of this group's first rank
    mine = {}
    for k, hw in enumerate(shapes):
        owner = (k % groups) * (world // groups)
        if rank == 0 and owner == 0:
            mine[k] = images[k]
        elif rank == 0:
            dist.send(torch.from_numpy(images[k]).contiguous(), dst=owner)
        elif rank == first and owner == rank:
            buf = torch.empty(int(hw[0]), int(hw[1]), 3, dtype=torch.uint8)
            dist.recv(buf, src=0)
            mine[k] = buf.numpy()
    return mine
