"""``python -m mmcirc.benchmark SUITE``: every suite behind the one parser; each runs end
to end at a tiny size and writes its JSON and table, the ratios in the tables are those
of the JSON."""

import json
import os.path as osp
import pkgutil

import pytest

from command_run import run_benchmark
from helpers import REPO, run_torch_only, torch_only_origin
from mmcirc.benchmark import suites
from mmcirc.benchmark.command import check_stride_sizes, main, parse_hw


def _load(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize(
    'suite', [*(m.name for m in pkgutil.iter_modules(suites.__path__)), 'docs']
)
def test_every_suite_has_its_subcommand(suite, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([suite, '--help'])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f'usage: python -m mmcirc.benchmark {suite} ')


def test_benchmark_attention_reports_every_method(tmp_path):
    methods = ['sdpa', 'circ-circ', 'core-8']
    run_benchmark(
        [
            'attention',
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
    run_benchmark(
        [
            'backbone',
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
    run_benchmark(
        [
            'backbone',
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


def test_isotropic_benchmark_writes_its_table_and_merges_a_secondrun_benchmark(tmp_path):
    tool = 'isotropic'
    common = ['--depth', '1', '--repeat', '1', '--out-dir', str(tmp_path)]
    run_benchmark([tool, '--models', 'ca_deit_t', 'deit_t', '--sizes', '32', *common], tmp_path)
    rows = _load(tmp_path / 'results.json')['results']
    assert set(rows) == {'ca_deit_t|32x32', 'deit_t|32x32'}
    table = (tmp_path / 'table.md').read_text()
    assert table.count('32x32') == 2
    ca, deit = rows['ca_deit_t|32x32'], rows['deit_t|32x32']
    assert ca['finite'] and deit['finite'] and ca['gmacs'] > 0
    assert f'{deit["time_ms"] / ca["time_ms"]:.2f}x' in table  # speed-up vs its baseline
    # a second run of another size: the first run's rows stay (same depth and threads)
    run_benchmark([tool, '--models', 'ca_deit_t', '--no-flops', '--sizes', '48', *common], tmp_path)
    merged = _load(tmp_path / 'results.json')['results']
    assert set(merged) == {'ca_deit_t|32x32', 'deit_t|32x32', 'ca_deit_t|48x48'}
    assert merged['deit_t|32x32'] == deit
    assert '48x48' in (tmp_path / 'table.md').read_text()


def test_isotropic_benchmark_bad_size_is_one_line(tmp_path):
    out = run_benchmark(
        ['isotropic', '--sizes', '0', '--out-dir', str(tmp_path)],
        tmp_path,
        check=False,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith('error: --sizes')
    assert not list(tmp_path.iterdir())


def test_compile_benchmark_eager_backend_equals_eager(tmp_path):
    run_benchmark(
        [
            'compile',
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


def test_an_unknown_suite_is_a_usage_error_naming_the_suites(tmp_path):
    out = run_benchmark(['nope'], tmp_path, check=False)
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith('python -m mmcirc.benchmark: error: argument SUITE: invalid choice:')
    assert "(choose from 'attention', 'backbone', 'isotropic', 'compile', 'compile_train', " in last
    assert "'gpu', 'sharded', 'launches', 'kernel', 'docs')" in last


def _benchmark_gpu_bare(args, cwd):
    code = 'import sys\nfrom mmcirc.benchmark.command import main\nmain(["gpu", *sys.argv[1:]])'
    return run_torch_only(code=code, args=args, cwd=cwd)


def test_benchmark_gpu_runs_on_cpu_with_torch_and_timm_alone(tmp_path):
    """The GPU suite's code paths (eager and torch.compile, bf16 and fp32, the table)
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


def test_sizes_are_square_or_height_first():
    assert parse_hw('224', '--sizes', 16) == (224, 224)
    assert parse_hw('64x96', '--sizes', 32) == (64, 96)
    check_stride_sizes([32, 1024, 2048])


@pytest.mark.parametrize('text', ['0', '17', '8x16', 'axb', '1x2x3', ''])
def test_bad_sizes_name_the_flag_and_the_rule(text):
    with pytest.raises(
        ValueError, match=r'^--sizes: each size must be S or HxW with multiples of 16'
    ):
        parse_hw(text, '--sizes', 16)


@pytest.mark.parametrize('sizes', [[0], [16], [1000], [1024, 33]])
def test_backbone_sides_off_the_stride_name_the_flag(sizes):
    with pytest.raises(ValueError, match=r'^--sizes must be multiples of 32 .*got \['):
        check_stride_sizes(sizes)
