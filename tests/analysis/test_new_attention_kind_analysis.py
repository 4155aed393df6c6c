"""The analysis of a new attention kind (the kind ``'pooled'`` of tests/pooled_kind.py,
added with no edit of mmcirc): the attention capture (``bccb_score`` / ``vis_*``) records
its matrix and the FLOP counter (``get_flops``) counts it as attention with the handle it
declares. The expectations are computed independently of the code under test: calls
counted with forward hooks, the layer's own output, the BCCB distance and the MACs by
hand.
"""

import math

import pytest
import torch
import torch.nn as nn
from pooled_kind import (
    TINY,
    PooledAttention,
    PooledPVT,
    pooled_registered,
)


@pytest.fixture
def registered():
    """The pooled kind registered for the test (tests/pooled_kind.py)."""
    with pooled_registered():
        yield


def _pooled_pvt(seed=0):
    """A PooledPVT (not registered: the analysis asks the modules), non-uniform p."""
    torch.manual_seed(seed)
    model = PooledPVT(arch=TINY).eval()
    for stage in model.stages[:2]:  # a non-uniform p: scale the tokens apart
        for block in stage.blocks:
            nn.init.normal_(block.norm1.weight, std=3.0)
    return model


def _attn_calls(model):
    """{name: (x, hw, output)} of every PooledAttention call, by forward hooks."""
    seen = {}
    for name, m in model.named_modules():
        if isinstance(m, PooledAttention):
            m.register_forward_hook(
                lambda m, a, o, name=name: seen.__setitem__(name, (a[0], tuple(a[1]), o))
            )
    return seen


def test_capture_finds_its_layers_as_matrix_attention():
    from mmcirc.analysis.attention_maps import find_attention_layers

    model = _pooled_pvt()
    pooled = [n for n, m in model.named_modules() if isinstance(m, PooledAttention)]
    assert len(pooled) == 3
    assert [n for n, k, _ in find_attention_layers(model, kinds=('pooled',))] == pooled
    matrix = find_attention_layers(model, forms=('matrix',))
    assert [n for n, k, _ in matrix if k != 'sra'] == pooled
    assert find_attention_layers(model, forms=('kernel', 'gather')) == []


def test_capture_records_the_matrix_the_layer_uses():
    """Every PooledAttention call is captured; the captured A reproduces the layer's
    output, gain * (A x), on the block's grid."""
    from mmcirc.analysis.attention_maps import AttentionCapture

    model = _pooled_pvt()
    calls = _attn_calls(model)
    with AttentionCapture(model, forms=('matrix',)) as cap, torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    pooled = [r for r in cap.records if r.kind == 'pooled']
    assert sorted(r.name for r in pooled) == sorted(calls) and len(calls) == 3
    for rec in pooled:
        x, hw, out = calls[rec.name]
        assert rec.form == 'matrix' and rec.q_grid == rec.k_grid == hw
        n = hw[0] * hw[1]
        assert rec.weights.shape == (1, 1, n, n)
        gain = model.get_submodule(rec.name).gain
        torch.testing.assert_close(out, gain * (rec.weights[:, 0] @ x), rtol=1e-5, atol=1e-6)


def test_bccb_score_scores_its_layers_with_the_closed_form():
    """bccb_score's scoring (mmcirc.cli.bccb_score.score) takes every
    'matrix' layer, so the pooled ones too. A rank-one A with rows p (computed here from
    the layer's input) projects onto the constant matrix S / N, S = sum_j p_j (every
    offset class holds each p_j once): ||A - P(A)|| / ||A|| = sqrt(1 - S^2 / (N sum p^2))."""
    from mmcirc.cli.bccb_score import score

    model = _pooled_pvt(1)
    calls = _attn_calls(model)
    entries = score(model, torch.randn(1, 3, 64, 64), shuffle=False)
    kinds = [e['kind'] for e in entries.values()]
    assert kinds == ['pooled'] * 3 + ['sra'] * 2
    for name, (x, hw, _) in calls.items():
        e = entries[name]
        assert e['q_grid'] == e['k_grid'] == list(hw) and e['heads'] == 1
        p = torch.softmax(x.double().mean(-1), -1)[0]  # (N,)
        expected = math.sqrt(1 - float(p.sum()) ** 2 / (p.numel() * float(p.square().sum())))
        assert expected > 0.01  # p is not uniform: a distance the projection must find
        assert e['distance'] == [pytest.approx(expected, rel=1e-4)]


IMG = (3, 64, 64)
#: {PooledAttention: its MACs}, per call (B = 1, N tokens, C channels): logsumexp N (the
#: declared handle) + exp N + the (1, N) @ (N, C) product N C; mean, sub, gain are free.
EXPECTED_MACS = {
    f'layers.{i}.blocks.{j}.attn': 2 * h * w + h * w * c
    for i, ((h, w), c) in enumerate((((16, 16), 8), ((8, 8), 16)))
    for j in range(TINY['depths'][i])
}


def test_flops_count_it_as_attention():
    from mmcirc.analysis import attention_modules, get_complexity

    model = _pooled_pvt()
    res = get_complexity(model, IMG)
    names = attention_modules(model)
    assert [n for n in names if n in EXPECTED_MACS] == list(EXPECTED_MACS)
    for name, macs in EXPECTED_MACS.items():
        assert res['by_module'][name] == macs, name
    others = [n for n in names if n not in EXPECTED_MACS]  # the SRA stages
    assert others and res['attention_flops'] == sum(EXPECTED_MACS.values()) + sum(
        res['by_module'][n] for n in others
    )


def test_flops_price_logsumexp_with_its_declared_handle():
    from mmcirc.analysis import get_complexity

    res = get_complexity(_pooled_pvt(), IMG)
    assert res['by_operator']['logsumexp'] == 16 * 16 * 1 + 8 * 8 * 2


class _Undeclared(PooledAttention):
    """The same operator without its declaration (not attention, no handle)."""

    attention_kind = None
    flop_handles = {}


def test_without_its_declaration_it_is_no_attention_and_logsumexp_is_free():
    from mmcirc.analysis import attention_modules, get_complexity

    model = _pooled_pvt()
    declared = get_complexity(model, IMG)
    for m in model.modules():
        if type(m) is PooledAttention:
            m.__class__ = _Undeclared
    plain = get_complexity(model, IMG)
    assert not set(attention_modules(model)) & set(EXPECTED_MACS)
    assert 'logsumexp' not in plain['by_operator']
    assert plain['flops'] == declared['flops'] - declared['by_operator']['logsumexp']


# --------------------------------------------------------------------------- tools
def _tool_argv():
    import os.path as osp

    from helpers import FIXTURE_CONFIGS

    cfg = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')
    options = [
        'model.backbone.type=PooledPVT',
        "model.backbone.stage_attentions=('pooled','pooled','sra','sra')",
    ]
    return [cfg, '--demo', 'astronaut', '--size', '64x96', '--cfg-options', *options]


def test_bccb_score_tool_scores_the_pooled_stages(tmp_path, registered):
    """The command scores the pooled stages of a config (with no edit of the tool),
    next to the SRA ones."""
    import json

    from mmcirc.cli import bccb_score

    assert bccb_score.main(_tool_argv() + ['--out-dir', str(tmp_path)]) == 0
    (out,) = tmp_path.iterdir()
    layers = json.loads((out / 'bccb_score.json').read_text())['layers']
    # 64x96 -> stage grids 16x24 and 8x12 (pooled: 1 head, keys = queries), then SRA
    assert [(e['kind'], e['q_grid'], e['k_grid'], e['heads']) for e in layers[:2]] == [
        ('pooled', [16, 24], [16, 24], 1),
        ('pooled', [8, 12], [8, 12], 1),
    ]
    assert [e['kind'] for e in layers[2:]] == ['sra', 'sra']
    assert all(0 < e['distance'][0] < 1 and e['shuffled'][0] > 0 for e in layers[:2])


def test_vis_cores_tool_names_the_kind_among_those_the_model_has(tmp_path, capsys, registered):
    from mmcirc.cli import vis_cores

    with pytest.raises(SystemExit):
        vis_cores.main(_tool_argv() + ['--out-dir', str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith('error: ') and 'no core attention layer' in err
    assert '(it has pooled, sra attention)' in err
