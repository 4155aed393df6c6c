"""The ``launches`` suite: its dispatch counter against ops counted by hand, and the suite
end to end at 64 px (counts and ratios in the table are those of its JSON)."""

import json

import pytest
import torch

from mmcirc.benchmark.command import main
from mmcirc.benchmark.suites import launches


def test_counter_leaves_out_views_and_allocations():
    x = torch.randn(4, 6)

    def fn(x):
        y = x.reshape(-1).view(6, 4).t()  # views only
        z = torch.empty(3)  # an allocation
        return (y + 1).mul(2).to(torch.float64), z

    _, ops = launches.count_ops(fn, x)
    assert dict(ops) == {'add': 1, 'mul': 1, '_to_copy': 1}


def test_counter_counts_a_reshape_that_copies():
    _, ops = launches.count_ops(lambda x: x.t().reshape(-1), torch.randn(4, 6))
    assert sum(ops.values()) == 1


def test_tool_counts_a_model_and_its_peer_on_both_layouts(tmp_path):
    main(['launches', '--models', 'ca_deit_t', '--sizes', '64', '--repeat', '2', '--out-dir',
          str(tmp_path)])  # fmt: skip
    res = json.loads((tmp_path / 'results.json').read_text())['results']
    assert set(res) == {
        f'{m}|64|{lay}|{p}'
        for m, lays in (('ca_deit_t', ('cuda', 'cpu')), ('deit_t', ('any',)))
        for lay in lays
        for p in ('fp32', 'bf16')
    }
    assert all(r['ops'] > r['casts'] >= 0 and r['host_ms'] > 0 for r in res.values())
    assert res['deit_t|64|any|bf16']['casts'] > res['deit_t|64|any|fp32']['casts'] == 0
    table = (tmp_path / 'table.md').read_text()
    a, b = res['ca_deit_t|64|cuda|fp32']['ops'], res['deit_t|64|any|fp32']['ops']
    assert f'| CA-DeiT-T (DeiT-T) | cuda | {a} / {b} ({a / b:.2f}x) |' in table


@pytest.mark.parametrize(
    'args, text',
    [
        (['--models', 'vit'], "error: --models: unknown ['vit']"),
        (['--sizes', '64', '--host-size', '128'], 'error: --host-size 128 must be one of --sizes'),
    ],
)
def test_bad_flags_are_one_line_errors(args, text, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(['launches', *args, '--out-dir', str(tmp_path / 'o')])
    assert exit_.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(text) and not (tmp_path / 'o').exists()
