"""The backbone suite's training-step table (``--backward``)."""

import json

from command_run import run_benchmark


def test_backward_times_the_training_step_in_its_own_table(tmp_path):
    args = ['backbone', '--models', 'circ_pvt_s', '--sizes', '64']
    args += ['--repeats', '1', '--threads', '1', '--backward', '--out-dir', str(tmp_path)]
    run_benchmark(args, tmp_path)
    with open(tmp_path / 'results_cpu_fwdbwd.json') as f:
        (r,) = json.load(f)['results']
    assert r['status'] == 'ok' and r['model'] == 'circ_pvt_s' and r['time_s'] > 0, r
    assert r['step'] == 'forward+backward'
    assert (tmp_path / 'table_cpu_fwdbwd.md').is_file()
    assert not (tmp_path / 'results_cpu.json').exists()
