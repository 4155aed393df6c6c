"""mmcirc.benchmark.docs and ``python -m mmcirc.benchmark docs``: the tables are rendered
from the suites' stores, written between their markers with the command and the machine,
and nothing outside the markers changes; a missing marker is one ``error:`` line before
anything is measured."""

import json
import os.path as osp
import shutil

import pytest

from helpers import REPO
from mmcirc.benchmark import docs

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
    """``python -m mmcirc.benchmark docs ARGS`` in this process, in tmp_path (the suites
    measure in their own child processes): its exit status and stderr."""
    from mmcirc.benchmark.command import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('OMP_NUM_THREADS', '1')

    def run(*args):
        capsys.readouterr()
        try:
            main(['docs', *map(str, args)])
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


def test_backbone_tables_come_from_one_run_of_the_suite(tmp_path, run_docs):
    doc, readme = _copy(tmp_path, 'benchmarks.md'), _copy(tmp_path, 'README.md')
    before, readme_before = doc.read_text(), readme.read_text()
    args = ['--doc', doc, '--headline', readme, '--tables', 'backbones', '--out-dir', 'out']
    proc = run_docs(*args, '--sizes', '64', '--models', 'pvt_s', 'circ_pvt_s')
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / 'out' / 'backbones' / 'results_cpu.json') as f:
        store = json.load(f)
    rec = {r['model']: r for r in store['results']}
    assert set(rec) == {'pvt_s', 'circ_pvt_s'}
    text = doc.read_text()
    assert _outside(text, ['backbones']) == _outside(before, ['backbones'])
    block = _between(text, 'backbones')
    command = block.strip().splitlines()[0]
    assert command.startswith('`python -m mmcirc.benchmark backbone --models pvt_s circ_pvt_s')
    assert '--sizes 64 --flops' in command
    env = store['environment']
    machine = block.strip().splitlines()[-1]
    assert machine.startswith('Machine: ') and env['cpu'] in machine
    assert f'torch {env["torch"]}' in machine and env['date'] in machine
    rows = {ln.split(' | ')[0].lstrip('| '): ln for ln in block.splitlines() if ln.startswith('| ')}
    for model, label in (('pvt_s', 'PVT-S (mmdet)'), ('circ_pvt_s', 'all-circulant PVT-S')):
        r, cells = rec[model], rows[label].strip('| ').split(' | ')
        assert cells[1] == f'{r["params"] / 1e6:.2f}'
        assert cells[2:5] == [f'{r["flops"] / 1e9:.1f}', f'{r["time_s"]:.2f}', f'{r["mem_mb"]:.0f}']
    speed = rec['pvt_s']['time_s'] / rec['circ_pvt_s']['time_s']
    assert rows['all-circulant PVT-S'].strip('| ').split(' | ')[5] == f'{speed:.2f}x'
    head = readme.read_text()
    assert _outside(head, ['headline']) == _outside(readme_before, ['headline'])
    assert f'{rec["circ_pvt_s"]["time_s"]:.2f} ({speed:.2f}x)' in _between(head, 'headline')

    # --no-run renders the same store again: the same file; an edited store shows in it
    assert run_docs(*args, '--no-run').returncode == 0
    assert doc.read_text() == text
    for r in store['results']:
        r['time_s'] = 123.456 if r['model'] == 'pvt_s' else r['time_s']
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


def test_the_attention_table_is_the_suites_store(tmp_path, monkeypatch):
    from mmcirc.benchmark.command import main

    out = tmp_path / 'attention'
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    main(
        ['attention', '--sizes', '8', '--repeat', '2', '--threads', '1', '--no-backward']
        + ['--methods', 'circ-circ', '--out-dir', str(out)]
    )
    store = docs.load_store(str(out / 'results.json'))
    md = docs.render_attention(store)
    time_row, mem_row = [ln for ln in md.splitlines() if ln.startswith('| 8x8 | fwd |')]
    for row, key in ((time_row, 'time_ms'), (mem_row, 'peak_mb')):
        cells = row.strip('| ').split(' | ')[2:]
        want = [f'{store["results"][f"{m}|8|fwd"][key]:.1f}' for m in ('circ-circ',)]
        assert cells == want


@pytest.mark.parametrize('name', list(docs.TABLES))
def test_every_table_s_flags_are_its_suite_s(name):
    from mmcirc.benchmark.command import build_parser

    table = docs.TABLES[name]
    argv = (
        docs.backbone_argv(docs.BACKBONE_MODELS, docs.BACKBONE_SIZES)
        if name == 'backbones'
        else table.argv
    )
    args = build_parser().parse_args([table.suite, *argv, '--out-dir', 'out'])
    assert args.suite == table.suite and args.out_dir == 'out'
