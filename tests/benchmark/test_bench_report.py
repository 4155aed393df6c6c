"""mmcirc.benchmark.report: the JSON store merges runs (and only runs of the same
settings), writes atomically; ratios against a baseline; markdown; the environment."""

import json
import os

import pytest

from mmcirc.benchmark import report
from mmcirc.benchmark.report import ResultStore, markdown_table, ratio, speedup


def _read(path):
    with open(path) as f:
        return json.load(f)


def test_a_second_run_merges_into_the_first(tmp_path):
    path = str(tmp_path / 'results.json')
    ResultStore(path).load(settings=dict(device='cpu')).update(
        {'a|32': dict(time_ms=1.0), 'b|32': dict(time_ms=2.0)}
    ).save(environment=dict(run=1))
    second = ResultStore(path).load(settings=dict(device='cpu'))
    assert set(second.results) == {'a|32', 'b|32'}
    second.update({'b|32': dict(time_ms=3.0), 'c|64': dict(time_ms=4.0)}).save(
        environment=dict(run=2)
    )
    data = _read(path)
    assert data['results'] == {
        'a|32': dict(time_ms=1.0),
        'b|32': dict(time_ms=3.0),  # the new measurement replaces the old one
        'c|64': dict(time_ms=4.0),
    }
    assert data['environment'] == dict(run=2) and data['settings'] == dict(device='cpu')


def test_runs_of_other_settings_are_not_merged(tmp_path):
    path = str(tmp_path / 'results.json')
    ResultStore(path).load(settings=dict(amp=None)).update({'a': dict(x=1)}).save()
    other = ResultStore(path).load(settings=dict(amp='bfloat16'))
    assert other.results == {}
    other.update({'b': dict(x=2)}).save()
    assert _read(path)['results'] == {'b': dict(x=2)}
    assert _read(path)['settings'] == dict(amp='bfloat16')


def test_save_is_atomic(tmp_path, monkeypatch):
    """A failure while writing leaves the previous file whole and no temporary file."""
    path = str(tmp_path / 'results.json')
    ResultStore(path).update({'a': dict(x=1)}).save()

    def fail(*args, **kwargs):
        raise OSError('disk full')

    monkeypatch.setattr(os, 'replace', fail)
    with pytest.raises(OSError, match='disk full'):
        ResultStore(path).load().update({'b': dict(x=2)}).save()
    assert _read(path)['results'] == {'a': dict(x=1)}
    assert os.listdir(tmp_path) == ['results.json']


def test_ratio_and_speedup():
    assert ratio(3.0, 1.5) == '2.00' and ratio(1, 3, '{:.1f}', 'x') == '0.3x'
    assert ratio(None, 1) == ratio(1, None) == ratio(1, 0) == '-'
    assert speedup(dict(time_ms=30.0), dict(time_ms=10.0)) == '3.00x'
    assert speedup(None, dict(time_ms=1.0)) == '-'
    assert speedup(dict(status='oom', time_ms=1.0), dict(time_ms=1.0)) == '-'


def test_markdown_table():
    text = markdown_table(['a', 'b'], [[1, 'x'], [2, 'y']], 'lr')
    assert text.splitlines() == ['| a | b |', '|---|---:|', '| 1 | x |', '| 2 | y |']


def test_environment_names_the_run():
    import torch

    env = report.environment('python tool.py --x', 'cpu', backend='eager')
    assert env['command'] == 'python tool.py --x' and env['torch'] == torch.__version__
    assert env['threads'] == torch.get_num_threads() and env['backend'] == 'eager'
    assert env['date'].endswith(' UTC') and env['device'] == 'cpu' and env['cpu_count'] >= 1


def test_environment_names_the_cpus_isa_and_native_bf16():
    """A bf16 table says whether the CPU has native bfloat16 (none: autocast emulated)."""
    import os.path as osp
    import re

    import torch

    env = report.environment('python tool.py', 'cpu')
    assert env['cpu_isa'] == torch.backends.cpu.get_cpu_capability()
    if not osp.isfile('/proc/cpuinfo'):
        return
    with open('/proc/cpuinfo') as f:
        text = f.read()
    if not re.search(r'^(flags|Features)\s*:', text, re.M):
        assert env['cpu_bf16'] is None
        return
    expected = [f for f in ('avx512_bf16', 'amx_bf16', 'bf16') if re.search(rf'\s{f}(\s|$)', text)]
    assert env['cpu_bf16'] == expected
