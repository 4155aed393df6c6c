""".dev_scripts/docs_tables.py and ``python .dev_scripts/benchmark_docs.py``: the tables
are rendered from the suites' stores, written between their markers with the command and
the machine, and nothing outside the markers changes; a missing marker is one ``error:``
line before anything is measured."""

import json
import os.path as osp
import shutil

import pytest

import benchmark_docs
import docs_tables as docs
from helpers import REPO

FIXTURES = osp.join(REPO, 'tests', 'fixtures', 'docs')


def _copy_text(name):
    with open(osp.join(FIXTURES, name)) as f:
        return f.read()


def _copy(tmp_path, name):
    path = tmp_path / name
    shutil.copy(osp.join(FIXTURES, name), path)
    return path


class Result:
    def __init__(self, returncode, stderr):
        self.returncode, self.stderr = returncode, stderr


@pytest.fixture
def run_docs(tmp_path, monkeypatch, capsys):
    """``python .dev_scripts/benchmark_docs.py ARGS`` in this process, in tmp_path (the
    suites measure in their own child processes): its exit status and stderr."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('OMP_NUM_THREADS', '1')

    def run(*args):
        capsys.readouterr()
        try:
            benchmark_docs.main(list(map(str, args)))
            rc = 0
        except SystemExit as err:
            rc = err.code
        return Result(rc, capsys.readouterr().err)

    return run


def _outside(text, names):
    """``text`` with what lies between each name's markers cut out."""
    for name in names:
        start = text.index(docs.marker(name)) + len(docs.marker(name))
        end = text.index(docs.END_MARKER, start)
        text = text[:start] + text[end:]
    return text


def _between(text, name):
    start = text.index(docs.marker(name)) + len(docs.marker(name))
    return text[start : text.index(docs.END_MARKER, start)]


def test_replace_blocks_changes_only_what_lies_between_the_markers():
    text = _copy_text('benchmarks.md')
    new = docs.replace_blocks(text, {'attention': 'A\n\nB', 'compile': 'C'})
    assert _outside(new, ['attention', 'compile']) == _outside(text, ['attention', 'compile'])
    assert _between(new, 'attention') == '\nA\n\nB\n'
    assert _between(new, 'compile') == '\nC\n'
    assert _between(new, 'backbones') == _between(text, 'backbones')
    assert docs.replace_blocks(new, {'attention': 'A\n\nB', 'compile': 'C'}) == new


@pytest.mark.parametrize(
    'text, message',
    [
        ('no markers\n', 'no marker line'),
        ('<!-- generated: compile -->\nold\n', 'has no'),
        ('<!-- generated: compile -->\n<!-- generated: compile -->\n<!-- end -->\n', '2 times'),
        ('<!-- generated: compile -->\n<!-- generated: x -->\n<!-- end -->\n', 'has no'),
    ],
)
def test_bad_markers_are_a_one_line_value_error(text, message):
    with pytest.raises(ValueError, match=message) as err:
        docs.replace_blocks(text, {'compile': 'C'}, 'doc.md')
    assert str(err.value).startswith('doc.md: ') and '\n' not in str(err.value)


def test_a_missing_marker_is_one_error_line_and_nothing_runs(tmp_path, run_docs):
    doc = tmp_path / 'doc.md'
    doc.write_text('# doc\n\n<!-- generated: attention -->\n<!-- end -->\n')
    proc = run_docs('--doc', doc, '--tables', 'attention', 'backbones', '--out-dir', 'out')
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
    assert "'<!-- generated: backbones -->'" in lines[0] and str(doc) in lines[0]
    assert doc.read_text() == '# doc\n\n<!-- generated: attention -->\n<!-- end -->\n'
    assert not (tmp_path / 'out').exists()


def test_backbone_tables_come_from_one_run_of_the_suite(backbone_run, tmp_path, run_docs):
    """The run of conftest's ``backbone_run`` (``--sizes 64 --models pvt_s circ_pvt_s``),
    then ``--no-run`` on a copy of its folder."""
    shutil.copytree(backbone_run, tmp_path, dirs_exist_ok=True)
    doc, readme = tmp_path / 'benchmarks.md', tmp_path / 'README.md'
    before, readme_before = _copy_text('benchmarks.md'), _copy_text('README.md')
    args = ['--doc', doc, '--headline', readme, '--tables', 'backbones', '--out-dir', 'out']
    with open(tmp_path / 'out' / 'backbones' / 'results_cpu.json') as f:
        store = json.load(f)
    rec = {k.split('|')[0]: r for k, r in store['results'].items()}
    assert set(rec) == {'pvt_s', 'circ_pvt_s'}
    text = doc.read_text()
    assert _outside(text, ['backbones']) == _outside(before, ['backbones'])
    block = _between(text, 'backbones')
    command = block.strip().splitlines()[0]
    assert command.startswith('`python -m mmcirc.benchmark model --models pvt_s circ_pvt_s')
    assert '--sizes 64 --flops' in command
    env = store['environment']
    machine = block.strip().splitlines()[-1]
    assert machine.startswith('Machine: ') and env['cpu'] in machine
    assert f'torch {env["torch"]}' in machine and env['date'] in machine
    rows = {ln.split(' | ')[0].lstrip('| '): ln for ln in block.splitlines() if ln.startswith('| ')}
    for model, label in (('pvt_s', 'PVT-S (mmdet)'), ('circ_pvt_s', 'all-circulant PVT-S')):
        r, cells = rec[model], rows[label].strip('| ').split(' | ')
        assert cells[1] == f'{r["params"] / 1e6:.2f}'
        seconds = r['time_ms'] / 1e3
        assert cells[2:5] == [f'{r["macs"] / 1e9:.1f}', f'{seconds:.2f}', f'{r["peak_mb"]:.0f}']
    speed = rec['pvt_s']['time_ms'] / rec['circ_pvt_s']['time_ms']
    assert rows['all-circulant PVT-S'].strip('| ').split(' | ')[5] == f'{speed:.2f}x'
    head = readme.read_text()
    assert _outside(head, ['headline']) == _outside(readme_before, ['headline'])
    circ_s = rec['circ_pvt_s']['time_ms'] / 1e3
    assert f'{circ_s:.2f} ({speed:.2f}x)' in _between(head, 'headline')

    # --no-run renders the same store again: the same file; an edited store shows in it
    assert run_docs(*args, '--no-run').returncode == 0
    assert doc.read_text() == text
    for k, r in store['results'].items():
        r['time_ms'] = 123456 if k.startswith('pvt_s|') else r['time_ms']
    with open(tmp_path / 'out' / 'backbones' / 'results_cpu.json', 'w') as f:
        json.dump(store, f)
    assert run_docs(*args, '--no-run').returncode == 0
    assert '| PVT-S (mmdet) | ' in doc.read_text() and ' | 123.46 | ' in doc.read_text()

    # without --headline the short table goes into a new file, between its markers
    assert (
        run_docs(*args[:2], '--tables', 'backbones', '--out-dir', 'out', '--no-run').returncode == 0
    )
    new = (tmp_path / 'out' / 'headline.md').read_text()
    assert new.startswith(docs.marker('headline') + '\n') and new.endswith(docs.END_MARKER + '\n')
    assert '| PVT-S (mmdet) | ' in new and ' | 123.46 | ' in new


def test_no_run_without_a_store_is_one_error_line(tmp_path, run_docs):
    doc = _copy(tmp_path, 'benchmarks.md')
    proc = run_docs('--doc', doc, '--tables', 'compile', '--no-run', '--out-dir', 'out')
    assert proc.returncode == 1 and proc.stderr.count('\n') == 1, proc.stderr
    assert proc.stderr.startswith('error: ') and doc.read_text() == _copy_text('benchmarks.md')


def test_the_attention_table_is_the_layer_suites_store(layer_run):
    store = docs.load_store(str(layer_run / 'results_cpu.json'))
    md = docs.render_attention(store)
    time_row, mem_row = [ln for ln in md.splitlines() if ln.startswith('| 8x8 | fwd |')]
    for row, key in ((time_row, 'time_ms'), (mem_row, 'peak_mb')):
        cells = row.strip('| ').split(' | ')[2:]
        want = [f'{store["results"][f"{m}|8|fwd"][key]:.1f}' for m in ('sdpa', 'circ-circ')]
        assert cells == want
    assert 'float32, 1 thread(s)' in md


def _cell(**r):
    return dict(dict(status='ok', runs=3, time_ms=10.0, peak_mb=100.0, params=2e6), **r)


def test_the_isotropic_and_compile_tables_of_a_model_store():
    """The docs' isotropic and compile tables from the ``model`` suite's one record
    layout (ms, MiB, counts): the figures, each model before its peer, the ratios."""
    store = dict(
        results={
            'ca_deit_t|32x32|1|fp32|eager': _cell(runs=1, macs=1e9),
            'deit_t|32x32|1|fp32|eager': _cell(time_ms=30.0, peak_mb=400.0, macs=2e9),
            'ca_deit_t|32x32|1|fp32|compile': _cell(
                time_ms=4.0, first_ms=2500.0, graphs=2, graph_breaks=1, max_rel_diff=1e-6
            ),
            'veca_s|32x32|1|fp32|eager': dict(status='oom', error='out of memory'),
            'ca_deit_t|32x32|2|fp32|eager': _cell(time_ms=1.0),  # not batch 1: left out
        },
        environment=dict(backend='inductor', mode='default'),
    )
    iso = docs.render_isotropic(store).splitlines()
    assert iso[2] == '| 32x32 | CA-DeiT-T | 2.00 | 1.00 | 10.0* | 100 | 3.00x | 0.25 |'
    assert iso[3] == '| 32x32 | DeiT-T | 2.00 | 2.00 | 30.0 | 400 | - | - |'
    assert iso[4] == '| 32x32 | VECA-S | - | - | oom (out of memory) | - | - | - |'
    comp = docs.render_compile(store).splitlines()
    assert comp[0].startswith("torch.compile backend='inductor', mode='default'; batch 1")
    assert comp[4] == '| CA-DeiT-T | 32x32 | 10.0 | 4.0 | 2.50x | 2.5 | 2 / 1 | 1.0e-06 |'


@pytest.mark.parametrize('name', list(docs.TABLES))
def test_every_table_s_flags_are_its_suite_s(name):
    from mmcirc.benchmark.command import build_parser, suite_modules

    table = docs.TABLES[name]
    argv = (
        docs.backbone_argv(docs.BACKBONE_MODELS, docs.BACKBONE_SIZES)
        if name == 'backbones'
        else table.argv
    )
    args = build_parser().parse_args([table.suite, *argv, '--out-dir', 'out'])
    assert args.suite == table.suite and args.out_dir == 'out'
    module = suite_modules()[table.suite]
    if hasattr(module, 'check') and table.suite != 'sharded':
        module.check(args)  # the values pass the suite's checks too
