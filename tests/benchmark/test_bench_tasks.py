"""mmcirc.benchmark.tasks: cases measured side by side in isolated children; a case
that fails is a result of that case, the others are still measured."""

import os

from mmcirc.benchmark.tasks import measure, measure_group

SPEC = dict(hw=[8, 8], threads=1, repeat=2)


def test_memory_children_then_one_timing_child():
    res = measure(['sdpa', 'circ-circ'], SPEC, timeout=600)
    assert list(res) == ['sdpa', 'circ-circ']
    for r in res.values():
        assert r['status'] == 'ok' and r['runs'] == 2 and r['threads'] == 1, r
        assert r['time_ms'] > 0 and r['peak_mb'] >= 0 and r['finite']
        assert r['memory_first_ms'] > 0 and r['params'] > 0
    # one timing process for both (round-robin), not the memory child's
    assert 'log_tail' not in res['sdpa']


def test_a_slow_first_call_keeps_the_memory_child_time():
    res = measure(['circ-zero'], dict(SPEC, single_run_above=1e-9), timeout=600)
    r = res['circ-zero']
    assert r['status'] == 'ok' and r['runs'] == 1 and r['warmup_only'], r
    assert r['time_ms'] == r['first_ms'] > 0


def test_a_failed_child_is_the_result_of_its_cases():
    """Memory children killed by the timeout (a fresh interpreter takes longer than
    0.5 s to import torch): each case reports 'timeout' and is not timed."""
    res = measure(['sdpa', 'core-8'], SPEC, timeout=0.5)
    for r in res.values():
        assert r['status'] == 'timeout' and r['error'] == 'timeout (> 0.5 s)', r
        assert 'time_ms' not in r


def test_group_in_process_matches_the_layout():
    res = measure_group(dict(SPEC, cases=['circ-linears'], flops='direct'))['results']
    r = res['circ-linears']
    assert r['status'] == 'ok' and r['runs'] == 2 and r['macs'] > 0
    # gate + qkv + proj Linears on 64 tokens of 64 channels: 64 * 64 * (64 + 3 * 64 + 64)
    assert r['macs'] == 64 * 64 * 64 * 5
    assert os.environ.get('OMP_NUM_THREADS') is None or r['threads'] == 1
