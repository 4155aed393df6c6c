"""The compile_train suite's figures from its runs' records: the median after the warm-up,
the graphs of the first iteration and after it, and the table's ratio of compiled to eager
(the suite end to end: tests/deployment/test_gpu_checks.py's rehearsal, step d4)."""

import statistics

import pytest

from mmcirc.benchmark.suites import compile_train as suite


def _run(seconds, graphs, size=(96, 128)):
    return dict(
        iterations=[
            dict(s=s, graphs=g, loss=1.0, input=[4, 3, *size]) for s, g in zip(seconds, graphs)
        ],
        graph_breaks=0,
        compile_s=12.4,
    )


def test_summary_counts_graphs_after_the_first_iteration_and_leaves_out_the_warmup():
    run = _run([30.0, 2.0, 1.0, 3.0, 2.0], [2, 0, 1, 0, 0])
    s = suite.summary(run, warmup=2)
    assert s['s_per_iter'] == statistics.median([1.0, 3.0, 2.0]) == 2.0
    assert s['first_s'] == 30.0 and s['graphs_first'] == 2 and s['recompiles'] == 1
    assert s['sizes'] == [(96, 128)]


def test_the_table_shows_compiled_over_eager_of_its_records():
    eager = dict(_run([5.0, 1.0, 1.0, 1.0], [0, 0, 0, 0]), status='ok')
    compiled = dict(_run([90.0, 0.8, 0.8, 0.8], [2, 0, 0, 0]), status='ok')
    eager.update(suite.summary(eager, 1))
    compiled.update(suite.summary(compiled, 1))
    store = dict(
        results={'det|eager': eager, 'det|compiled': compiled},
        settings=dict(iters=4, warmup=1, backend='inductor', threads=None),
        environment=dict(command='python -m mmcirc.benchmark compile_train', load=1.0),
        load_after=2.0,
    )
    text = suite.table(store)
    (row,) = [ln for ln in text.splitlines() if ln.startswith('| RetinaNet')]
    cells = [c.strip() for c in row.strip('|').split('|')]
    assert cells[1:5] == ['96x128', '1.00', '0.80', '0.80x']
    assert cells[5:9] == ['5.0 / 90.0', '12', '2 / 0', '0']
    assert 'median of iterations 2-4' in text


@pytest.mark.parametrize(
    'argv, message',
    [
        (['--jobs', 'nope'], "--jobs: unknown ['nope']"),
        (['--warmup', '20'], '--warmup must be in [0, --iters)'),
        (['--backend', 'nope'], "argument --backend: invalid choice: 'nope' (choose from"),
    ],
)
def test_bad_flags_are_one_error_line(argv, message, capsys):
    from mmcirc.benchmark.command import main

    with pytest.raises(SystemExit) as exit_:
        main(['compile_train', *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(err) == 1 and message in err[0], err
