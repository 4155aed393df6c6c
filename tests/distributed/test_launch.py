"""mmcirc.distributed.run_parallel: results in rank order, one error naming the failing rank
(not the ranks that failed because of it), ranks with several threads after the parent
ran OpenMP regions; leaving_group: the group is gone after the body, returned or raised."""

import functools

import pytest
import torch
import torch.distributed as dist

from mmcirc.distributed import launch, leaving_group, run_parallel


def _rank_sum(x):
    t = torch.tensor([float(dist.get_rank() + x)])
    dist.all_reduce(t)
    return dist.get_rank(), t.item()


def _fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError('boom on rank 1')
    dist.barrier()  # rank 0 waits for rank 1, which is gone


def _sum_then_leave():
    with leaving_group():
        t = torch.ones(1)
        dist.all_reduce(t)
    return t.item(), dist.is_initialized()


def _raise_then_leave():
    try:
        with leaving_group():
            raise KeyError('body')
    except KeyError:
        return dist.is_initialized()


def _threaded_matmul():
    a = torch.randn(512, 512, dtype=torch.float64)
    return torch.get_num_threads(), (a @ a).sum().item()


def test_results_in_rank_order_and_collectives_work():
    # ranks 0, 1, 2 contribute 1, 2, 3
    assert run_parallel(_rank_sum, 3, (1,)) == [(0, 6.0), (1, 6.0), (2, 6.0)]


def test_a_failing_rank_is_named_with_its_own_error():
    with pytest.raises(RuntimeError, match=r'^rank 1 failed: ValueError: boom on rank 1$'):
        run_parallel(_fail_on_rank_1, 2, timeout_s=120)


def test_the_failing_rank_reports_before_its_peers_echo(monkeypatch):
    """With no grace period for later messages, the first one must already be the
    failing rank's own error, not a peer's 'Connection closed by peer'."""
    monkeypatch.setattr(launch, '_first_cause', functools.partial(launch._first_cause, grace_s=0))
    for _ in range(3):
        with pytest.raises(RuntimeError, match=r'^rank 1 failed: ValueError: boom on rank 1$'):
            run_parallel(_fail_on_rank_1, 2, timeout_s=120)


def test_ranks_with_two_threads_after_the_parent_used_openmp():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(512, 512, dtype=torch.float64)
        (a @ a).sum()  # the parent's OpenMP pool is up
        ((threads, _),) = run_parallel(_threaded_matmul, 1, threads=2, timeout_s=300)
    finally:
        torch.set_num_threads(before)
    assert threads == 2


def test_secondary_errors_are_the_peers_echo_not_a_cause():
    assert launch.is_secondary_error('RuntimeError: [gloo] Connection closed by peer [::1]:1')
    assert not launch.is_secondary_error('ValueError: world_size=4 is larger than the 3 rows')


def test_leaving_group_destroys_the_group_after_the_body():
    assert run_parallel(_sum_then_leave, 2, timeout_s=120) == [(2.0, False), (2.0, False)]


def test_leaving_group_destroys_the_group_when_the_body_raises():
    assert run_parallel(_raise_then_leave, 2, timeout_s=120) == [False, False]
