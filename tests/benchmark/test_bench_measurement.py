"""mmcirc.benchmark.measurement: round-robin timing (order, medians, budget, single runs,
failures as results), the peak-memory meter, threads and the step of one model."""

import time

import pytest
import torch
from helpers import touch_fresh_pages
from torch import nn

from mmcirc.benchmark.measurement import PeakMeter, finite, make_step, pin_threads, round_robin


def _sleeper(log, name, seconds):
    def step():
        log.append(name)
        time.sleep(seconds)
        return torch.ones(1)

    return step


def test_round_robin_alternates_after_the_warmups():
    log = []
    steps = {'a': _sleeper(log, 'a', 0), 'b': _sleeper(log, 'b', 0)}
    res = round_robin(steps, repeat=3, warmup=2)
    assert log == ['a', 'a', 'b', 'b'] + ['a', 'b'] * 3
    assert res['a']['runs'] == res['b']['runs'] == 3 and not res['a']['warmup_only']


def test_round_robin_reports_the_median_of_its_runs():
    res = round_robin({'fast': _sleeper([], 'f', 0.01), 'slow': _sleeper([], 's', 0.04)}, repeat=3)
    for name, seconds in (('fast', 0.01), ('slow', 0.04)):
        r = res[name]
        assert r['time_ms'] >= 1e3 * seconds and len(r['times_ms']) == 3
        assert r['time_ms'] == pytest.approx(sorted(r['times_ms'])[1], abs=1e-3)
        assert r['min_ms'] == pytest.approx(min(r['times_ms']), abs=1e-3)
    assert res['slow']['time_ms'] > res['fast']['time_ms']


def test_budget_stops_a_slow_step_after_min_runs():
    log = []
    steps = {'slow': _sleeper(log, 'slow', 0.05), 'fast': _sleeper(log, 'fast', 0)}
    res = round_robin(steps, repeat=8, budget_s=0.12, min_runs=2)
    # the slow step stops at the first run that fills its budget (0.05 s a run: about 3)
    times = res['slow']['times_ms']
    assert 2 <= len(times) < 8 and sum(times[:-1]) < 120 <= sum(times)
    assert log.count('slow') == 1 + len(times) and res['fast']['runs'] == 8
    one = round_robin({'slow': _sleeper([], 'slow', 0.05)}, repeat=4, budget_s=0.01, min_runs=2)
    assert one['slow']['runs'] == 2  # min_runs although the budget is spent after one


def test_a_slow_first_call_is_the_single_run():
    log = []
    res = round_robin({'slow': _sleeper(log, 'slow', 0.1)}, repeat=5, single_run_above=0.05)
    assert log == ['slow'] and res['slow']['runs'] == 1 and res['slow']['warmup_only']
    assert res['slow']['time_ms'] == res['slow']['first_ms'] >= 100


def test_failing_first_call_is_a_result_when_recorded():
    def oom():
        raise MemoryError()

    def boom():
        raise RuntimeError('boom')

    steps = {'oom': oom, 'boom': boom, 'ok': _sleeper([], 'ok', 0)}
    res = round_robin(steps, repeat=2, record_errors=True)
    assert res['oom'] == dict(status='oom', error='out of memory')
    assert res['boom'] == dict(status='error', error='RuntimeError: boom')
    assert res['ok']['runs'] == 2
    with pytest.raises(RuntimeError, match='boom'):
        round_robin({'boom': boom})


def test_round_robin_checks_its_counts():
    with pytest.raises(ValueError, match='repeat, warmup and min_runs must be >= 1'):
        round_robin({}, repeat=0)


def test_cpu_peak_meter_sees_an_allocation():
    """256 MiB of fresh pages written inside the block: the meter reads at least that."""
    with PeakMeter('cpu') as meter:
        touch_fresh_pages(256 << 20)
    assert meter.peak_mb >= 250
    if meter.reset:  # the high-water mark was lowered: nothing much besides the pages
        assert meter.peak_mb < 250 + 200


def test_pin_threads_sets_and_reports():
    before = torch.get_num_threads()
    try:
        assert pin_threads(1) == 1 == torch.get_num_threads()
        assert pin_threads(None) == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match='threads must be a positive int'):
        pin_threads(-2)


def _linear():
    torch.manual_seed(0)
    return nn.Linear(8, 4), torch.randn(2, 8)


def test_step_is_the_model_forward():
    model, x = _linear()
    out = make_step(model, model, x)()
    with torch.no_grad():
        torch.testing.assert_close(out, x @ model.weight.T + model.bias, rtol=0, atol=1e-6)
    assert not out.requires_grad and not model.training


def test_step_under_bf16_autocast_and_compiled():
    model, x = _linear()
    ref = make_step(model, model, x)()
    bf16 = make_step(model, model, x, precision='bf16')()
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), ref, rtol=2e-2, atol=2e-2)
    compiled = make_step(model, model, x, compile=dict(backend='eager'))()
    torch.testing.assert_close(compiled, ref)


def test_backward_step_leaves_no_gradients():
    model, x = _linear()
    seen = []
    model.weight.register_hook(lambda g: seen.append(g.clone()))
    make_step(model, model, x, backward=True)()
    # d sum(x W^T + b) / dW = column sums of x, per output row
    torch.testing.assert_close(seen[0], x.sum(0).expand(4, 8))
    assert model.weight.grad is None and x.grad is None


def test_step_checks_precision_and_compile_mode():
    model, x = _linear()
    with pytest.raises(ValueError, match="precision must be one of \\('fp32', 'bf16', 'fp16'\\)"):
        make_step(model, model, x, precision='int8')
    with pytest.raises(ValueError, match='compile mode must be one of'):
        make_step(model, model, x, compile=dict(mode='fastest'))


def test_finite_walks_nested_outputs():
    assert finite((torch.ones(2), [torch.zeros(1)], {'a': torch.ones(1)}))
    assert not finite((torch.ones(2), torch.tensor([float('nan')])))
