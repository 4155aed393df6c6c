"""mmcirc.distributed.run_parallel: results in rank order, one error naming the failing rank
(not the ranks that failed because of it), ranks with several threads after the parent
ran OpenMP regions, fork-server ranks that run backward after the parent ran a compiled
one; leaving_group: the group is gone after the body, returned or raised."""

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


def _backward(x):
    x = x.clone().requires_grad_()
    (x * x).sum().backward()
    return x.grad


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


def test_forkserver_ranks_run_backward_after_the_parent_ran_a_compiled_one():
    """A compiled backward starts autograd's worker threads in this process, after which
    a forked child cannot run backward; the fork server's children can, and get their
    arguments (a tensor) by value."""
    f = torch.compile(lambda t: (t * 2).sin(), backend='aot_eager')
    f(torch.ones(3, requires_grad=True)).sum().backward()
    x = torch.arange(4.0)
    got = run_parallel(_backward, 2, args=(x,), start_method='forkserver', timeout_s=300)
    assert all(torch.equal(g, 2 * x) for g in got)


def test_an_unknown_start_method_is_refused():
    with pytest.raises(
        ValueError,
        match=r"^start_method must be one of \('fork', 'forkserver', 'spawn'\), got 'thread'$",
    ):
        run_parallel(_rank_sum, 1, (1,), start_method='thread')
