"""The benchmark tools (tools/analysis/benchmark_*.py, tools/deployment/benchmark_gpu.py):
thin entry points over mmcirc.benchmark; each runs end to end at a tiny size and writes
its JSON and table, the ratios in the tables are those of the JSON."""

import json
import os
import os.path as osp
import subprocess
import sys

import pytest

from helpers import REPO, run_tool, run_torch_only, torch_only_origin

TOOLS = (
    'tools/analysis/benchmark_attention.py',
    'tools/analysis/benchmark_backbone.py',
    'tools/analysis/benchmark_isotropic.py',
    'tools/analysis/benchmark_compile.py',
    'tools/analysis/benchmark_compile_train.py',
    'tools/deployment/benchmark_gpu.py',
    'tools/analysis/benchmark_sharded.py',
    'tools/analysis/benchmark_docs.py',
    'tools/analysis/benchmark_launches.py',
)
ENV = dict(OMP_NUM_THREADS='1')


def _load(path):
    with open(path) as f:
        return json.load(f)


def _run(args, tmp_path, check=True):
    return run_tool(args, cwd=tmp_path, timeout=600, env=ENV, check=check)


@pytest.mark.parametrize('tool', TOOLS)
def test_tools_are_thin_entry_points(tool):
    """At most 80 lines, no sys.path edits, no script loaded by its path."""
    with open(osp.join(REPO, tool)) as f:
        text = f.read()
    assert len(text.splitlines()) <= 80
    for banned in ('sys.path', 'spec_from_file_location', 'runpy'):
        assert banned not in text, (tool, banned)
    assert 'from mmcirc.cli.benchmark_' in text


def test_benchmark_attention_reports_every_method(tmp_path):
    methods = ['sdpa', 'circ-circ', 'core-8']
    _run(
        [
            'tools/analysis/benchmark_attention.py',
            '--sizes',
            '8',
            '--repeat',
            '2',
            '--threads',
            '1',
            '--no-backward',
            '--methods',
            *methods,
            '--out-dir',
            str(tmp_path),
        ],
        tmp_path,
    )
    res = _load(tmp_path / 'results.json')
    for m in methods:
        r = res['results'][f'{m}|8|fwd']
        assert r['status'] == 'ok' and r['runs'] == 2 and r['threads'] == 1, (m, r)
        assert r['time_ms'] > 0 and r['peak_mb'] >= 0 and r['finite'], (m, r)
    # the CPU targets need 128^2 and 256^2: not measured here, never a verdict
    assert {verdict for _, _, verdict in res['targets']} == {'not measured'}
    table = (tmp_path / 'table.md').read_text()
    assert table.count('| 8x8 |') == 7  # every method row
    ratio = res['results']['sdpa|8|fwd']['time_ms'] / res['results']['circ-circ|8|fwd']['time_ms']
    assert '| circ-circ | 8x8 | 64 | ' in table and f'{ratio:.1f}x |' in table
    assert res['environment']['threads'] >= 1 and res['settings']['threads'] == 1


def test_benchmark_backbone_side_by_side(tmp_path):
    _run(
        [
            'tools/analysis/benchmark_backbone.py',
            '--models',
            'pvt_s',
            'circ_pvt_s',
            '--sizes',
            '64',
            '--repeats',
            '2',
            '--min-repeats',
            '1',
            '--threads',
            '1',
            '--flops',
            '--out-dir',
            str(tmp_path),
        ],
        tmp_path,
    )
    res = {r['model']: r for r in _load(tmp_path / 'results_cpu.json')['results']}
    assert set(res) == {'pvt_s', 'circ_pvt_s'}
    for r in res.values():
        assert r['status'] == 'ok' and r['size'] == 64, r
        assert r['time_s'] > 0 and r['mem_mb'] >= 0 and r['flops'] > 0
    table = (tmp_path / 'table_cpu.md').read_text()
    ratio = res['pvt_s']['time_s'] / res['circ_pvt_s']['time_s']
    assert '| 64 | all-circulant PVT-S |' in table and f'{ratio:.2f}x' in table


def test_benchmark_backbone_bf16_has_its_own_table(tmp_path):
    """``--precisions bf16`` (autocast: tests/benchmark/test_bench_core.py) writes
    results_cpu_bf16.json / table_cpu_bf16.md, not into the float32 table."""
    _run(
        [
            'tools/analysis/benchmark_backbone.py',
            '--models',
            'circ_pvt_s',
            '--sizes',
            '64',
            '--repeats',
            '1',
            '--threads',
            '1',
            '--precisions',
            'bf16',
            '--out-dir',
            str(tmp_path),
        ],
        tmp_path,
    )
    (r,) = _load(tmp_path / 'results_cpu_bf16.json')['results']
    assert r['status'] == 'ok' and r['model'] == 'circ_pvt_s' and r['time_s'] > 0, r
    assert _load(tmp_path / 'results_cpu_bf16.json')['environment']['precision'] == 'bf16'
    assert (tmp_path / 'table_cpu_bf16.md').is_file()
    assert not (tmp_path / 'results_cpu.json').exists()


def test_isotropic_benchmark_writes_its_table_and_merges_a_second_run(tmp_path):
    tool = 'tools/analysis/benchmark_isotropic.py'
    common = ['--depth', '1', '--repeat', '1', '--out-dir', str(tmp_path)]
    _run([tool, '--models', 'ca_deit_t', 'deit_t', '--sizes', '32', *common], tmp_path)
    rows = _load(tmp_path / 'results.json')['results']
    assert set(rows) == {'ca_deit_t|32x32', 'deit_t|32x32'}
    table = (tmp_path / 'table.md').read_text()
    assert table.count('32x32') == 2
    ca, deit = rows['ca_deit_t|32x32'], rows['deit_t|32x32']
    assert ca['finite'] and deit['finite'] and ca['gmacs'] > 0
    assert f'{deit["time_ms"] / ca["time_ms"]:.2f}x' in table  # speed-up vs its baseline
    # a second run of another size: the first run's rows stay (same depth and threads)
    _run([tool, '--models', 'ca_deit_t', '--no-flops', '--sizes', '48', *common], tmp_path)
    merged = _load(tmp_path / 'results.json')['results']
    assert set(merged) == {'ca_deit_t|32x32', 'deit_t|32x32', 'ca_deit_t|48x48'}
    assert merged['deit_t|32x32'] == deit
    assert '48x48' in (tmp_path / 'table.md').read_text()


def test_isotropic_benchmark_bad_size_is_one_line(tmp_path):
    out = _run(
        ['tools/analysis/benchmark_isotropic.py', '--sizes', '0', '--out-dir', str(tmp_path)],
        tmp_path,
        check=False,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith('error: --sizes')
    assert not list(tmp_path.iterdir())


def test_compile_benchmark_eager_backend_equals_eager(tmp_path):
    _run(
        [
            'tools/analysis/benchmark_compile.py',
            '--models',
            'ca_deit_t',
            '--sizes',
            '32',
            '--backend',
            'eager',
            '--repeat',
            '1',
            '--out-dir',
            str(tmp_path),
        ],
        tmp_path,
    )
    text = (tmp_path / 'table.md').read_text()
    r = _load(tmp_path / 'results.json')['results']['ca_deit_t|32x32']
    assert 'CA-DeiT-T' in text and r['max_rel_diff'] == 0 and r['graph_breaks'] == 0
    assert f'{r["speedup"]:.2f}x' in text and r['shapes']


def test_module_entry_names_the_suites(tmp_path):
    out = subprocess.run(
        [sys.executable, '-m', 'mmcirc.benchmark', 'nope'],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        'error: usage: python -m mmcirc.benchmark SUITE [ARGS], SUITE one of '
        "('attention', 'backbone', 'isotropic', 'compile', 'compile_train', 'gpu', 'sharded', "
        "'launches', 'kernel', 'docs')"
    ]


def _benchmark_gpu_bare(args, cwd):
    return run_torch_only('tools/deployment/benchmark_gpu.py', args=args, cwd=cwd)


def test_benchmark_gpu_runs_on_cpu_with_torch_and_timm_alone(tmp_path):
    """The GPU script's code paths (eager and torch.compile, bf16 and fp32, the table)
    on the CPU at a tiny size with 2 blocks (compile with the 'eager' backend), on a
    machine like the lent GPU one: no OpenMMLab library, mmcirc not installed, the
    repository on PYTHONPATH. The CA-DeiT it times is mmcirc's CADeiT (same parameters
    as the class built here)."""
    pytest.importorskip('timm')
    from mmcirc.models.backbones.ca_deit import CADeiT

    proc = _benchmark_gpu_bare(
        [
            '--device',
            'cpu',
            '--sizes',
            '32',
            '--batches',
            '1',
            '--depth',
            '2',
            '--repeat',
            '1',
            '--compile-backend',
            'eager',
            '--out-dir',
            str(tmp_path),
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert torch_only_origin(proc) == dict(mmcirc=osp.join(REPO, 'mmcirc', '__init__.py'), mm=[])
    res = json.loads((tmp_path / 'results_cpu.json').read_text())
    cells = res['results']
    assert set(cells) == {
        f'{m}|32|1|{p}|{mode}'
        for m in ('deit_t', 'ca_deit_t')
        for p in ('bf16', 'fp32')
        for mode in ('eager', 'compile')
    }
    assert res['skipped'] == []
    assert all(c['finite'] and c['time_ms'] > 0 and c['first_call_s'] > 0 for c in cells.values())
    ca_params = sum(p.numel() for p in CADeiT(arch=dict(embed_dims=192, depth=2)).parameters())
    C = 192  # DeiT-T: 5,717,416 published with its 1000-class head; 12 blocks of 12C^2 + 13C
    deit_params = 5_717_416 - (C * 1000 + 1000) - 10 * (12 * C * C + 13 * C)
    for key, cell in cells.items():
        assert cell['params'] == (ca_params if key.startswith('ca_') else deit_params), key
    table = (tmp_path / 'table_cpu.md').read_text()
    assert '2 blocks' in table
    for p in ('bf16', 'fp32'):
        for mode in ('eager', 'compile'):
            ca, deit = cells[f'ca_deit_t|32|1|{p}|{mode}'], cells[f'deit_t|32|1|{p}|{mode}']
            assert f'{deit["time_ms"] / ca["time_ms"]:.2f}x' in table
    assert table.count('| CA-DeiT-T |') == table.count('| DeiT-T |') == 2


@pytest.mark.parametrize(
    'args,message',
    [
        (['--device', 'cuda'], 'error: --device cuda: CUDA is not available'),
        (['--sizes', '100'], 'error: --sizes must be multiples of the patch size 16, got [100]'),
        (['--depth', '0'], 'error: --depth must be > 0, got 0'),
    ],
)
def test_benchmark_gpu_errors_are_one_line(tmp_path, args, message):
    """Bad flags and a missing GPU: one line ``error: ...`` on stderr, exit 1, no
    traceback, nothing written (also without OpenMMLab: main_guard is torch-free)."""
    import torch

    if args[:2] == ['--device', 'cuda'] and torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    proc = _benchmark_gpu_bare([*args, '--out-dir', str(tmp_path / 'out')], cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [message]
    assert not (tmp_path / 'out').exists()
