"""The ``sharded`` suite (``python -m mmcirc.benchmark sharded``): one record per P with every
rank's figures, bytes only where ranks talk, runs merged, the table's ratio against P = 1."""

import json

import pytest

from helpers import tiny_pyramid_config
from mmcirc.benchmark.command import main


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('bench_sharded')
    cfg = tiny_pyramid_config(tmp)
    out = tmp / 'out'
    main(['sharded', cfg, '--size', '64', '--nprocs', '1', '--out-dir', str(out)])
    main(['sharded', cfg, '--size', '64', '--nprocs', '2', '--out-dir', str(out)])  # merges
    with open(out / 'results.json') as f:
        return cfg, json.load(f), (out / 'table.md').read_text()


def test_one_record_per_p_with_every_rank(run):
    cfg, data, _ = run
    results = data['results']
    assert sorted(results) == [f'{cfg}@64@1', f'{cfg}@64@2']
    for p in (1, 2):
        ranks = results[f'{cfg}@64@{p}']['ranks']
        assert [r['rank'] for r in ranks] == list(range(p))
        for r in ranks:
            assert r['backbone']['time_s'] > 0 and r['predict']['peak_increase_mb'] >= 0


def test_only_sharded_ranks_send_bytes(run):
    cfg, data, _ = run
    assert 'bytes_sent' not in data['results'][f'{cfg}@64@1']['ranks'][0]
    assert all(r['bytes_sent']['total'] > 0 for r in data['results'][f'{cfg}@64@2']['ranks'])


def test_table_has_a_row_per_p_and_ratios_against_p1(run):
    _, _, table = run
    rows = [line for line in table.splitlines() if line.startswith('| tiny_allcirc')]
    assert len(rows) == 2
    assert rows[0].split('|')[5].strip() == '1.00' or rows[0].split('|')[5].strip() == '-'
    assert rows[1].split('|')[5].strip() not in ('', '-')


def test_missing_config_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(['sharded', str(tmp_path / 'none.py'), '--out-dir', str(tmp_path / 'o')])
    assert exc.value.code == 1
    assert capsys.readouterr().err.startswith('error: config file not found')
    assert not (tmp_path / 'o').exists()
