"""mmcirc.benchmark.runner: a measurement in a fresh child; timeout, RLIMIT_AS and the
ways a child dies become statuses ('ok', 'oom', 'timeout', 'error'), never a crash of
the caller."""

import os
import os.path as osp
import time

import pytest

from mmcirc.benchmark.runner import STATUSES, run_isolated

HERE = osp.dirname(osp.abspath(__file__))
ENV = dict(PYTHONPATH=HERE, OMP_NUM_THREADS='1')


def _run(target, spec=None, **kwargs):
    return run_isolated(f'runner_targets:{target}', spec or {}, env=ENV, **kwargs)


def test_result_comes_from_another_process():
    res = _run('echo', dict(x=21))
    assert res['status'] == 'ok' and res['doubled'] == 42 and res['returncode'] == 0
    assert res['pid'] != os.getpid() and res['wall_s'] > 0
    assert res['rlimit_as_gb'] is None and 'error' not in res


def test_python_memory_error_under_the_cap_is_oom():
    res = _run('allocate_bytes', dict(gib=32), mem_cap_gb=6)
    assert res['status'] == 'oom', res
    assert res['rlimit_as_gb'] == 6 and res['error'].startswith('MemoryError')


def test_torch_allocation_failure_under_the_cap_is_oom():
    """torch's CPU allocator raises a RuntimeError ("can't allocate memory"), not a
    MemoryError: classified by its message. The same allocation without the cap does
    not happen here (32 GiB), so the cap is what refuses it."""
    res = _run('allocate_tensor', dict(gib=32), mem_cap_gb=6)
    assert res['status'] == 'oom', res
    assert 'allocate' in res['error'].lower()


def test_small_allocation_under_the_cap_is_ok():
    res = _run('allocate_bytes', dict(gib=1), mem_cap_gb=6)
    assert res['status'] == 'ok' and res['allocated'] == 1 << 30, res


def test_sigkill_is_oom_and_bad_alloc_abort_is_oom():
    killed = _run('killed')
    assert killed['status'] == 'oom' and killed['returncode'] == -9, killed
    assert 'SIGKILL' in killed['error']
    aborted = _run('aborts_with_bad_alloc')
    assert aborted['status'] == 'oom' and aborted['returncode'] < 0, aborted


def test_exception_and_hard_exit_are_errors():
    res = _run('raise_value_error')
    assert res['status'] == 'error' and res['returncode'] == 0
    assert res['error'] == 'ValueError: size must be positive, got -1'
    hard = _run('exits_hard')
    assert hard['status'] == 'error' and hard['returncode'] == 3
    assert hard['error'] == 'something went wrong'


def test_timeout_kills_the_child():
    t = time.perf_counter()
    res = _run('sleeps', dict(seconds=60), timeout=3)
    assert res['status'] == 'timeout' and res['error'] == 'timeout (> 3 s)', res
    assert time.perf_counter() - t < 30 and res['returncode'] < 0


def test_a_status_of_the_target_is_kept():
    res = _run('partial')
    assert res['status'] == 'oom' and res['failed_during'] == 'inference'
    assert res['status'] in STATUSES


@pytest.mark.parametrize(
    'kwargs,message',
    [
        (dict(target='no_colon'), "target must be 'module:function'"),
        (dict(target='a:b', timeout=0), 'timeout must be > 0'),
        (dict(target='a:b', mem_cap_gb=-1), 'mem_cap_gb must be > 0'),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, message):
    target = kwargs.pop('target')
    with pytest.raises(ValueError, match=message):
        run_isolated(target, {}, **kwargs)


def test_missing_target_is_an_error_result():
    res = run_isolated('runner_targets:nope', {}, env=ENV)
    assert res['status'] == 'error' and res['error'].startswith('AttributeError')
