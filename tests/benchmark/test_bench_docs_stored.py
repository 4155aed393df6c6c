"""The main job's stored runs (docs/results/toy_job.json) as the README and
docs/benchmarks.md render them."""

import copy
import json
import os.path as osp

import pytest

import docs_stored

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture
def store():
    with open(osp.join(REPO, 'docs', 'results', 'toy_job.json')) as f:
        return json.load(f)


def test_every_run_of_the_results_file_names_its_commit_torch_and_threads(store):
    for which in ('runs', 'earlier_runs'):
        for run in store[which]:
            assert all(run.get(k) for k in ('date', 'machine', 'commit', 'torch')), run
            assert set(run['threads']) == set(store['jobs']), run


def test_the_readme_range_is_of_the_current_numerics_only(store):
    earlier = copy.deepcopy(store['earlier_runs'][0])
    earlier['seg']['mIoU'] = '11.11'  # below every current run: it would open the range
    store['earlier_runs'].append(earlier)
    text = docs_stored.render_toy(store)
    assert '11.11' not in text and store['numerics']['what'] in text
    assert store['numerics']['commit'] not in text  # the commits are docs/benchmarks.md's
    lows = sorted((r['seg']['mIoU'] for r in store['runs']), key=float)
    assert f'**mIoU {lows[0]}-{lows[-1]}**' in text or f'**mIoU {lows[0]}**' in text


def test_a_run_without_its_commit_is_refused_naming_it(store):
    del store['runs'][0]['commit']
    with pytest.raises(ValueError, match=r'^runs\[0\] of the main job must name commit$'):
        docs_stored.render_toy(store)


def test_a_range_of_one_cpu_type_is_refused(store):
    store['runs'] = [store['runs'][0], dict(store['runs'][0], date='2099-01-01')]
    with pytest.raises(ValueError, match='at least 2 CPU types'):
        docs_stored.render_toy(store)


def test_the_runs_table_marks_the_earlier_numerics(store):
    text = docs_stored.render_toy_runs(store)
    for run in store['earlier_runs']:
        assert f'{run["commit"]} (earlier numerics)' in text
    for run in store['runs']:
        assert f'| {run["commit"]} |' in text
