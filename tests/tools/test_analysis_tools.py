"""tools/analysis: the complexity plot runs end to end on tiny inputs, and what it
reports is checked against analytic counts where one exists (the benchmarks:
tests/benchmark/test_bench_command.py)."""

import json
import math

import pytest

from helpers import run_tool


def _load(path):
    with open(path) as f:
        return json.load(f)


def _sdpa_block_macs(n, c):
    """qkv + proj linears (biases not counted), SDPA B Lq Lk (E + Ev), softmax."""
    return n * c * 3 * c + n * c * c + n * n * 2 * c + n * n


def _circulant_block_macs(h, w, c):
    """CirculantAttention, d = 1 (tests/analysis/test_flops.py writes out the terms)."""
    n, fw = h * w, w // 2 + 1
    return (
        2 * n * c * c
        + 3 * c * c * 2 * h * fw
        + 4 * c * 1.25 * n * math.log2(n)
        + 2 * 4 * c * h * fw
        + c * n
    )


def test_plot_complexity_counts_match_analytic(tmp_path):
    run_tool(
        [
            'tools/analysis/plot_complexity.py',
            '--dims',
            '16',
            '--block-sides',
            '8',
            '16',
            '--models',
            'circ_pvt_s',
            '--sizes',
            '64',
            '--out-dir',
            str(tmp_path),
        ],
        cwd=tmp_path,
        timeout=600,
    )
    res = _load(tmp_path / 'complexity.json')
    block = res['block']['series']
    for side in (8, 16):
        n = side * side
        sdpa = next(e for e in block['self-attention (SDPA)'] if e['side'] == side)
        circ = next(
            e for k, s in block.items() if k.startswith('circulant') for e in s if e['side'] == side
        )
        assert sdpa['gmacs'] * 1e9 == pytest.approx(_sdpa_block_macs(n, 16), rel=1e-9)
        assert circ['gmacs'] * 1e9 == pytest.approx(_circulant_block_macs(side, side, 16), rel=1e-9)
    (entry,) = res['backbones']['series']['all-circulant PVT-S']
    assert entry['size'] == 64 and entry['gmacs'] > 0
    assert (tmp_path / 'block.png').is_file() and (tmp_path / 'backbones.png').is_file()
