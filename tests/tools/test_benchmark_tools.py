"""tools/analysis/benchmark_isotropic.py and benchmark_compile.py run end to end at tiny
sizes and write their tables; the FLOP counts are checked against published numbers."""

import json
import os
import runpy
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, OMP_NUM_THREADS='1')


@pytest.fixture(scope='module')
def isotropic():
    """tools/analysis/benchmark_isotropic.py's functions (its ``build``: the models)."""
    pytest.importorskip('timm')
    return runpy.run_path(os.path.join(REPO, 'tools', 'analysis', 'benchmark_isotropic.py'))


def _params(model):
    return sum(p.numel() for p in model.parameters())


def _run(tool, *args, timeout=600):
    return subprocess.run(
        [sys.executable, f'tools/analysis/{tool}', *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_isotropic_benchmark_writes_its_table(tmp_path):
    out = _run(
        'benchmark_isotropic.py',
        '--models',
        'ca_deit_t',
        'deit_t',
        '--sizes',
        '32',
        '--depth',
        '1',
        '--repeat',
        '1',
        '--out-dir',
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    records = json.load(open(tmp_path / 'results.json'))
    rows = records['results'] if isinstance(records, dict) else records
    assert len(rows) == 2
    table = (tmp_path / 'table.md').read_text()
    assert table.count('32x32') == 2
    ca, deit = rows['ca_deit_t|32x32'], rows['deit_t|32x32']
    assert ca['finite'] and deit['finite']
    assert f'{deit["time_ms"] / ca["time_ms"]:.2f}x' in table  # speed-up vs its baseline


def test_isotropic_benchmark_bad_size_is_one_line(tmp_path):
    out = _run('benchmark_isotropic.py', '--sizes', '0', '--out-dir', str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith('error: ')
    assert not list(tmp_path.iterdir())


def test_compile_benchmark_eager_backend_equals_eager(tmp_path):
    out = _run(
        'benchmark_compile.py',
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
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / 'table.md').read_text()
    assert 'CA-DeiT-T' in text
    assert (tmp_path / 'results.json').is_file()


def test_cadeit_parameters_follow_the_official_layout(isotropic):
    """CA-DeiT-T (mmcirc's CADeiT) from DeiT-T (timm), both without a classifier, counted
    by hand: per block the attention loses the qkv bias (3C) and gains the gate
    (C^2 + C), plus a CPE (9C + C); the model drops the class token (C) and the
    197 x C position embedding."""
    c, depth = 192, 12
    deit = _params(isotropic['build']('deit_t'))
    ca = _params(isotropic['build']('ca_deit_t'))
    assert deit + c * 1000 + 1000 == 5_717_416  # timm's DeiT-T with its head (published 5.7 M)
    assert ca == deit + depth * (c * c + c - 3 * c + 10 * c) - c - 197 * c


def test_gmacs_extrapolated_from_two_blocks_equal_the_full_count(isotropic):
    """count_gmacs counts 1 and 2 blocks and extrapolates to 12: the same number as
    counting the whole model, and DeiT-T lands on its published 1.3 GFLOPs (1.26)."""
    import torch

    from mmcirc.analysis import count_flops

    img = torch.randn(1, 3, 224, 224)
    gmacs = {}
    for name in ('deit_t', 'ca_deit_t'):
        gmacs[name] = isotropic['count_gmacs'](name, (224, 224))
        full = count_flops(isotropic['build'](name), img) / 1e9
        assert gmacs[name] == pytest.approx(full, rel=1e-9), name
    assert gmacs['deit_t'] == pytest.approx(1.26, rel=0.02)
    assert 0 < gmacs['ca_deit_t'] < 2 * gmacs['deit_t']
