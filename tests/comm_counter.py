"""Bytes a rank hands to torch.distributed, counted by wrapping the collectives the
sharded operators use (only in the forked worker processes of run_parallel)."""

import contextlib

import torch.distributed as dist


@contextlib.contextmanager
def count_comm():
    """Yields a dict {'all_to_all': bytes sent to other ranks, 'all_reduce': payload bytes}
    filled while the context is active."""
    counts = {'all_to_all': 0, 'all_reduce': 0}
    a2a, red = dist.all_to_all_single, dist.all_reduce

    def all_to_all_single(out, inp, out_split=None, in_split=None, group=None, **kw):
        rank = dist.get_rank(group)
        counts['all_to_all'] += (sum(in_split) - in_split[rank]) * inp.element_size()
        return a2a(out, inp, out_split, in_split, group=group, **kw)

    def all_reduce(t, *args, **kw):
        counts['all_reduce'] += t.numel() * t.element_size()
        return red(t, *args, **kw)

    dist.all_to_all_single, dist.all_reduce = all_to_all_single, all_reduce
    try:
        yield counts
    finally:
        dist.all_to_all_single, dist.all_reduce = a2a, red
