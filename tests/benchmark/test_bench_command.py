"""``python -m mmcirc.benchmark SUITE``: every suite module behind the one parser; each
runs end to end at a tiny size and writes its JSON and table, the ratios in the tables are
those of the JSON; every bad value is one ``error:`` line, exit 1."""

import json
import os.path as osp
import pkgutil

import pytest

from helpers import REPO, run_torch_only, torch_only_origin
from mmcirc.benchmark import suites
from mmcirc.benchmark.command import main
from mmcirc.benchmark.grid import parse_hw


def _load(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize('suite', [m.name for m in pkgutil.iter_modules(suites.__path__)])
def test_every_suite_has_its_subcommand(suite, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([suite, '--help'])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f'usage: python -m mmcirc.benchmark {suite} ')


def test_benchmark_layer_reports_every_method(layer_run):
    res = _load(layer_run / 'results_cpu.json')
    for m in ('sdpa', 'circ-circ'):
        r = res['results'][f'{m}|8|fwd']
        assert r['status'] == 'ok' and r['runs'] == 2 and r['threads'] == 1, (m, r)
        assert r['time_ms'] > 0 and r['peak_mb'] >= 0 and r['finite'], (m, r)
    # the CPU targets need 128^2 and 256^2: not measured here, never a verdict
    assert {verdict for _, _, verdict in res['targets']} == {'not measured'}
    table = (layer_run / 'table_cpu.md').read_text()
    assert table.count('| 8x8 |') == 2  # every method row
    ratio = res['results']['sdpa|8|fwd']['time_ms'] / res['results']['circ-circ|8|fwd']['time_ms']
    assert '| circ-circ | 8x8 | 64 | ' in table and f'{ratio:.1f}x |' in table
    assert res['environment']['threads'] >= 1 and res['settings']['threads'] == 1


def test_layer_errors_are_against_float64(tmp_path):
    """``--errors``: the FFT path in float32 is within float32 rounding of float64, in
    bf16 autocast (the FFTs stay in float32, the linears in bf16) within bf16's."""
    args = ['layer', '--sizes', '8', '--repeat', '1', '--threads', '1', '--no-backward']
    args += ['--in-process', '--methods', 'sdpa', 'fft', '--errors', '--precision']
    for precision, low, high in (('fp32', 0, 1e-5), ('bf16', 1e-4, 3e-2)):
        out = tmp_path / precision
        main([*args, precision, '--out-dir', str(out)])
        res = _load(out / 'results_cpu.json')['results']
        assert low <= res['fft|8|fwd']['rel_error'] < high, res['fft|8|fwd']
        assert 'rel_error' not in res['sdpa|8|fwd']


def _model(tmp_path, *args):
    """The ``model`` suite in this process (``--in-process``: no children)."""
    main(['model', *args, '--threads', '1', '--in-process', '--out-dir', str(tmp_path)])


def test_benchmark_model_backbones_side_by_side(backbone_run):
    """The suite's own store and table of the docs' backbone run (conftest: ``--models pvt_s
    circ_pvt_s --sizes 64 --flops``, memory children)."""
    out = backbone_run / 'out' / 'backbones'
    res = _load(out / 'results_cpu.json')['results']
    assert set(res) == {'pvt_s|64x64|1|fp32|eager', 'circ_pvt_s|64x64|1|fp32|eager'}
    for r in res.values():
        assert r['status'] == 'ok' and r['time_ms'] > 0 and r['peak_mb'] >= 0 and r['macs'] > 0
    table = (out / 'table_cpu.md').read_text()
    base, circ = res['pvt_s|64x64|1|fp32|eager'], res['circ_pvt_s|64x64|1|fp32|eager']
    assert f'| all-circulant PVT-S | {circ["params"] / 1e6:.2f} |' in table
    assert f'{base["time_ms"] / circ["time_ms"]:.2f}x' in table


def test_benchmark_model_training_step_bf16_has_its_own_file(tmp_path):
    """``--backward --precisions bf16``: results_cpu_fwdbwd.json, the bf16 cell."""
    _model(tmp_path, '--models', 'circ_pvt_s', '--sizes', '64', '--repeat', '1',
           '--precisions', 'bf16', '--backward')  # fmt: skip
    store = _load(tmp_path / 'results_cpu_fwdbwd.json')
    (key,) = store['results']
    assert key == 'circ_pvt_s|64x64|1|bf16|eager' and store['settings']['backward']
    assert store['results'][key]['status'] == 'ok' and store['results'][key]['time_ms'] > 0
    assert (tmp_path / 'table_cpu_fwdbwd.md').is_file()
    assert not (tmp_path / 'results_cpu.json').exists()


def test_model_isotropic_writes_its_table_and_merges_a_second_run(tmp_path):
    common = ['--depth', '1', '--repeat', '1']
    _model(tmp_path, '--models', 'ca_deit_t', 'deit_t', '--sizes', '32', '--flops', *common)
    rows = _load(tmp_path / 'results_cpu.json')['results']
    ca, deit = rows['ca_deit_t|32x32|1|fp32|eager'], rows['deit_t|32x32|1|fp32|eager']
    assert set(rows) == {'ca_deit_t|32x32|1|fp32|eager', 'deit_t|32x32|1|fp32|eager'}
    table = (tmp_path / 'table_cpu.md').read_text()
    assert table.count('| 32x32 |') == 2
    assert ca['finite'] and deit['finite'] and ca['macs'] > 0
    assert f'{deit["time_ms"] / ca["time_ms"]:.2f}x' in table  # speed-up vs its peer
    # a second run of another size: the first run's rows stay (same depth and threads)
    _model(tmp_path, '--models', 'ca_deit_t', '--sizes', '48', *common)
    merged = _load(tmp_path / 'results_cpu.json')['results']
    assert set(merged) == set(rows) | {'ca_deit_t|48x48|1|fp32|eager'}
    assert merged['deit_t|32x32|1|fp32|eager'] == deit
    assert '48x48' in (tmp_path / 'table_cpu.md').read_text()


def test_model_compile_with_the_eager_backend_equals_eager(tmp_path):
    _model(tmp_path, '--models', 'ca_deit_t', '--sizes', '32', '--depth', '1', '--repeat', '1',
           '--modes', 'eager', 'compile', '--compile-backend', 'eager', '--explain')  # fmt: skip
    res = _load(tmp_path / 'results_cpu.json')['results']
    e, c = res['ca_deit_t|32x32|1|fp32|eager'], res['ca_deit_t|32x32|1|fp32|compile']
    assert c['max_rel_diff'] == 0 and c['graph_breaks'] == 0 and c['graphs'] >= 1 and c['shapes']
    assert c['first_ms'] > 0 and 'graphs' not in e
    row = next(ln for ln in (tmp_path / 'table_cpu.md').read_text().splitlines() if 'CA-DeiT' in ln)
    assert f'| {e["time_ms"]:.2f} | - | {c["time_ms"]:.2f} | - |' in row
    assert row.endswith(f'| {c["first_ms"] / 1e3:.1f} | {c["graphs"]} / 0 | 0.0e+00 |')


def test_an_unknown_suite_is_one_error_line_naming_the_suites():
    """``python -m mmcirc.benchmark nope`` (its ``__main__``, in a torch-only process)."""
    code = 'import runpy, sys\nsys.argv[1:] = ["nope"]\n'
    out = run_torch_only(code=code + 'runpy.run_module("mmcirc.benchmark", run_name="__main__")')
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: argument SUITE: invalid choice: 'nope' (choose from ")
    for name in (m.name for m in pkgutil.iter_modules(suites.__path__)):
        assert f"'{name}'" in line


def _model_bare(args, cwd):
    code = 'import sys\nfrom mmcirc.benchmark.command import main\nmain(["model", *sys.argv[1:]])'
    return run_torch_only(code=code, args=args, cwd=cwd)


def test_model_runs_the_gpu_checks_grid_with_torch_and_timm_alone(tmp_path):
    """The GPU check's grid (eager and torch.compile, bf16 and fp32, the table; in one
    process) on the CPU at a tiny size with 2 blocks (compile with the 'eager' backend), on a
    machine like the lent GPU one: no OpenMMLab library, mmcirc not installed, the
    repository on PYTHONPATH. The CA-DeiT it times is mmcirc's CADeiT (same parameters
    as the class built here)."""
    pytest.importorskip('timm')
    from mmcirc.models.backbones.ca_deit import CADeiT

    args = ['--models', 'deit_t', 'ca_deit_t', '--device', 'cpu', '--sizes', '32', '--depth', '2']
    args += ['--repeat', '1', '--precisions', 'bf16', 'fp32', '--modes', 'eager', 'compile']
    args += ['--compile-backend', 'eager', '--in-process']  # as gpu_checks.sh runs it
    proc = _model_bare([*args, '--out-dir', str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert torch_only_origin(proc) == dict(mmcirc=osp.join(REPO, 'mmcirc', '__init__.py'), mm=[])
    res = json.loads((tmp_path / 'results_cpu.json').read_text())
    cells = res['results']
    assert set(cells) == {
        f'{m}|32x32|1|{p}|{mode}'
        for m in ('deit_t', 'ca_deit_t')
        for p in ('bf16', 'fp32')
        for mode in ('eager', 'compile')
    }
    assert res['skipped'] == []
    assert all(c['finite'] and c['time_ms'] > 0 and c['first_ms'] > 0 for c in cells.values())
    ca_params = sum(p.numel() for p in CADeiT(arch=dict(embed_dims=192, depth=2)).parameters())
    C = 192  # DeiT-T: 5,717,416 published with its 1000-class head; 12 blocks of 12C^2 + 13C
    deit_params = 5_717_416 - (C * 1000 + 1000) - 10 * (12 * C * C + 13 * C)
    for key, cell in cells.items():
        assert cell['params'] == (ca_params if key.startswith('ca_') else deit_params), key
    table = (tmp_path / 'table_cpu.md').read_text()
    assert '2 blocks' in table
    for p in ('bf16', 'fp32'):
        for mode in ('eager', 'compile'):
            ca, deit = cells[f'ca_deit_t|32x32|1|{p}|{mode}'], cells[f'deit_t|32x32|1|{p}|{mode}']
            assert f'{deit["time_ms"] / ca["time_ms"]:.2f}x' in table
    assert table.count('| CA-DeiT-T |') == table.count('| DeiT-T |') == 2


@pytest.mark.parametrize(
    'args,message',
    [
        (['--device', 'cuda'], 'error: --device cuda: CUDA is not available'),
        (
            ['--sizes', '100'],
            "error: --sizes: each size must be S or HxW with multiples of 16 (>= 16), got '100'",
        ),
        (['--depth', '0'], 'error: --depth must be >= 1, got 0'),
        (
            ['--precisions', 'fp8'],
            "error: argument --precisions: invalid choice: 'fp8' (choose from 'fp32', 'bf16', "
            "'fp16')",
        ),
    ],
)
def test_model_errors_are_one_line(tmp_path, args, message):
    """Bad flags (argparse's and the suite's checks alike) and a missing GPU: one line
    ``error: ...`` on stderr, exit 1, no traceback, nothing written (also without
    OpenMMLab: main_guard is torch-free)."""
    import torch

    if args[:2] == ['--device', 'cuda'] and torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    args = ['--models', 'ca_deit_t', 'deit_t', *args, '--out-dir', str(tmp_path / 'out')]
    proc = _model_bare(args, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [message]
    assert not (tmp_path / 'out').exists()


def test_a_list_flag_given_twice_adds_and_a_single_value_flag_takes_the_last():
    """Every list flag of every suite (``nargs`` '+' / '*') accumulates; the defaults stay."""
    import argparse

    from mmcirc.benchmark.command import Store, build_parser

    parser = build_parser()
    args = parser.parse_args(['layer', '--sizes', '8', '--sizes', '16', '32', '--methods', 'sdpa',
                              '--methods', 'fft', '--repeat', '2', '--repeat', '3'])  # fmt: skip
    assert (args.sizes, args.methods, args.repeat) == ([8, 16, 32], ['sdpa', 'fft'], 3)
    assert parser.parse_args(['layer']).sizes == [32, 64, 128, 256, 512]
    (subs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    lists = {(name, a.dest): type(a) for name, sub in subs.choices.items()
             for a in sub._actions if a.nargs in ('+', '*')}  # fmt: skip
    assert ('model', 'models') in lists and ('sharded', 'configs') in lists
    assert set(lists.values()) == {Store}, lists


def test_sizes_are_square_or_height_first():
    assert parse_hw('224', '--sizes', 16) == (224, 224)
    assert parse_hw('64x96', '--sizes', 32) == (64, 96)
    assert [parse_hw(s, '--sizes', 32) for s in (32, 2048)] == [(32, 32), (2048, 2048)]


@pytest.mark.parametrize('text', ['0', '17', '8x16', 'axb', '1x2x3', ''])
def test_bad_sizes_name_the_flag_and_the_rule(text):
    with pytest.raises(
        ValueError, match=r'^--sizes: each size must be S or HxW with multiples of 16'
    ):
        parse_hw(text, '--sizes', 16)


@pytest.mark.parametrize('sizes', [[0], [16], [1000], [1024, 33]])
def test_backbone_sides_off_the_stride_name_the_flag(sizes):
    """The docs' backbone sides (integers): multiples of the total stride, 32."""
    with pytest.raises(
        ValueError, match=r'^--sizes: each size must be S or HxW with multiples of 32'
    ):
        [parse_hw(s, '--sizes', 32) for s in sizes]
