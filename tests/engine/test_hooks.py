"""NestedCoreHook: the C' distribution of nested core training, and rank agreement."""

import collections
import logging
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from mmcirc.engine import NestedCoreHook, core_count_choices


class Elastic(nn.Module):
    """Records every core count it is given."""

    def __init__(self, num_cores=16):
        super().__init__()
        self.seen, self.num_cores = [], num_cores

    def set_num_cores(self, n):
        self.seen.append(n)
        self.num_cores = n


class FakeRunner:
    def __init__(self, num_cores=16):
        self.model = nn.Sequential(Elastic(num_cores), nn.Sequential(Elastic(num_cores)))
        self.logger = logging.getLogger('fake-runner')


def test_choices_are_powers_of_two_up_to_max():
    assert core_count_choices(64) == [1, 2, 4, 8, 16, 32, 64]
    assert core_count_choices(48) == [1, 2, 4, 8, 16, 32, 48]
    assert core_count_choices(1) == [1]


def test_sampled_distribution():
    # P(64) = 0.5 + 0.5/7, every other choice 0.5/7, nothing outside the set.
    hook = NestedCoreHook(max_cores=64, seed=0)
    n = 40000
    counts = collections.Counter(hook.sample() for _ in range(n))
    assert set(counts) == {1, 2, 4, 8, 16, 32, 64}
    assert counts[64] / n == pytest.approx(0.5 + 0.5 / 7, abs=0.01)
    for c in (1, 2, 4, 8, 16, 32):
        assert counts[c] / n == pytest.approx(0.5 / 7, abs=0.006)


def test_sets_every_elastic_module_and_eval_count():
    runner, hook = FakeRunner(), NestedCoreHook(max_cores=16, eval_num_cores=8, seed=1)
    hook.before_train(runner)
    hook.before_train_iter(runner, 0)
    a, b = runner.model[0], runner.model[1][0]
    assert a.seen == b.seen == [hook.current] and hook.current in {1, 2, 4, 8, 16}
    hook.before_val(runner)
    assert a.seen[-1] == 8
    hook.after_val(runner)
    assert a.seen[-1] == hook.current
    hook.before_test(runner)
    assert b.seen[-1] == 8


def test_evaluates_with_the_configured_count_by_default():
    runner, hook = FakeRunner(num_cores=4), NestedCoreHook(max_cores=16, seed=3)
    hook.before_train(runner)
    for i in range(5):
        hook.before_train_iter(runner, i)
    hook.before_val(runner)
    assert runner.model[0].num_cores == 4
    test_only = FakeRunner(num_cores=2)  # tools/test.py: no training before the test
    hook = NestedCoreHook(max_cores=16)
    hook.before_test(test_only)
    assert test_only.model[0].num_cores == 2 and test_only.model[0].seen == []


def test_model_without_elastic_module_is_an_error():
    runner = FakeRunner()
    runner.model = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match='set_num_cores'):
        NestedCoreHook(max_cores=8).before_train_iter(runner, 0)


@pytest.mark.parametrize(
    'kwargs, name',
    [
        (dict(max_cores=0), 'max_cores'),
        (dict(max_cores=8, p_max=1.5), 'p_max'),
        (dict(max_cores=8, eval_num_cores=9), 'eval_num_cores'),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NestedCoreHook(**kwargs)


def _worker(rank, port, queue):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=2)
    # Different seeds per rank: agreement must come from the broadcast, not the RNG.
    hook = NestedCoreHook(max_cores=64, seed=rank)
    runner = FakeRunner()
    for i in range(30):
        hook.before_train_iter(runner, i)
    queue.put((rank, runner.model[0].seen))
    dist.destroy_process_group()


def test_all_ranks_use_the_same_core_count():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    seen = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert seen[0] == seen[1] and len(set(seen[0])) > 1
