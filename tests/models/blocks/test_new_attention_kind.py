"""A new attention kind needs nothing but its own registered block.

This file registers a fictitious block, kind ``'pooled'`` (every token attends to the
patches with the same weights ``p = softmax_j(mean_c x_j)``, computed in O(N) through
``logsumexp``, times one new parameter, a per-channel gain initialised to 1; then PVT's
/ Swin's MLP), and shows that, with no edit anywhere else, CA-PVT and CA-Swin build and
run with it (``stage_attentions`` short form and ``block_cfgs``), the high-res
overrides accept it, the converters report its added key as new, the attention
capture (``bccb_score`` / ``vis_*``) records its matrix and the FLOP counter
(``get_flops``) counts it as attention, with the FLOP handle its probe declares for
``logsumexp`` (an op mmengine does not price). The expectations are computed
independently of the code under test: key sets from the source and target state
dicts, calls counted with forward hooks, the layer's own output, the BCCB distance and
the MACs by hand. The registration is removed after each test (the registries are
global).
"""

import contextlib
import math
import warnings
from collections import Counter

import pytest
import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.config import Config
from mmengine.model import BaseModule

from mmcirc import apis as hr
from mmcirc.analysis.attention_memory import quadratic_attention_estimates
from mmcirc.models.backbones import CAPVT, CASwin
from mmcirc.models.blocks import AttentionProbe, PyramidBlock
from mmcirc.models.blocks.base import apply_ffn, build_ffn
from mmcirc.models.backbones.pyramid_convert import convert_pyramid
from mmcirc.models.backbones.pyramid_target import build_backbone
from mmcirc.models.convert import format_summary
from mmcirc.registry import model_registries, register_model

TINY = dict(embed_dims=[8, 16, 24, 32], depths=[1, 2, 1, 1], num_heads=[1, 2, 2, 4])
ORIGINAL = {CAPVT: 'sra', CASwin: 'window'}


class PooledAttention(nn.Module):
    """y_i = gain * sum_j p_j x_j with p = softmax_j(mean_c x_j): A[i, j] = p_j for every
    query i (rank one), computed in O(N); x (B, N, C) -> (B, N, C)."""

    def __init__(self, embed_dims):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(embed_dims))

    def forward(self, x, hw_shape):
        s = x.mean(-1)  # (B, N)
        p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))  # (B, N)
        return (self.gain * (p.unsqueeze(1) @ x)).expand_as(x)  # (B, 1, C) -> (B, N, C)


def _logsumexp_macs(inputs, outputs):
    """mmengine op handle: one exponential per input element (as a softmax)."""
    return Counter({'logsumexp': math.prod(inputs[0].type().sizes())})


class PooledProbe(AttentionProbe):
    """How the analysis sees PooledAttention: its matrix (B, 1, N, N), rows p."""

    kind = 'pooled'
    form = 'matrix'
    flop_handles = {'aten::logsumexp': _logsumexp_macs}

    def matches(self, module):
        return isinstance(module, PooledAttention)

    def weights(self, module, args, kwargs, ctx):
        x, hw = args[0], tuple(args[1])
        p = torch.softmax(x.mean(-1), -1)  # (B, N)
        return dict(weights=p[:, None, None].expand(-1, 1, x.shape[1], -1), q_grid=hw, k_grid=hw)


class PooledBlock(PyramidBlock, BaseModule):
    """``x + attn(LN(x))``, then the family's MLP; ``attn.gain`` is what is new."""

    kind = 'pooled'
    attention_probes = (PooledProbe(),)
    added_keys = ('attn.',)

    def __init__(
        self,
        embed_dims,
        feedforward_channels,
        drop_path_rate=0.0,
        ffn_type='ffn',
        act_cfg=dict(type='GELU'),
        norm_cfg=dict(type='LN'),
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = PooledAttention(embed_dims)
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = build_ffn(
            ffn_type, embed_dims, feedforward_channels, 0.0, drop_path_rate, act_cfg
        )

    def forward(self, x, hw_shape):
        x = x + self.attn(self.norm1(x), hw_shape)
        return apply_ffn(self.ffn, self.norm2(x), hw_shape, identity=x)


@contextlib.contextmanager
def pooled_registered():
    register_model(PooledBlock)
    try:
        yield
    finally:
        for registry in model_registries():
            registry.module_dict.pop('PooledBlock', None)


def _layout(cls):
    return ('pooled', 'pooled', ORIGINAL[cls], ORIGINAL[cls])


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_kind_is_offered_only_while_registered(cls):
    with pooled_registered():
        assert 'pooled' in cls.attention_choices()
    assert 'pooled' not in cls.attention_choices()
    with pytest.raises(ValueError, match="stage_attentions\\[0\\] must be one of .* got 'pooled'"):
        cls(arch=TINY, stage_attentions=_layout(cls))


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_backbones_build_and_run_with_it(cls):
    with pooled_registered():
        for kwargs in (
            dict(stage_attentions=_layout(cls)),
            dict(attention='pooled'),
            dict(block_cfgs=[dict(type='PooledBlock'), dict(type='PooledBlock'), None, None]),
        ):
            model = cls(arch=TINY, num_cores_max=8, **kwargs).eval()
            assert model.stage_attentions == _layout(cls)
            assert [s.attention for s in model.stages] == list(_layout(cls))
            calls = []
            for stage in model.stages[:2]:
                for block in stage.blocks:
                    assert type(block) is PooledBlock
                    block.register_forward_hook(lambda *a: calls.append(1))
            assert all(s.cores is None for s in model.stages)
            with torch.no_grad():
                outs = model(torch.randn(1, 3, 64, 64))
                assert [tuple(o.shape) for o in outs] == [
                    (1, 8, 16, 16),
                    (1, 16, 8, 8),
                    (1, 24, 4, 4),
                    (1, 32, 2, 2),
                ]
            assert len(calls) == TINY['depths'][0] + TINY['depths'][1]


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_gain_reaches_the_output(cls):
    with pooled_registered():
        torch.manual_seed(0)
        model = cls(arch=TINY, stage_attentions=_layout(cls)).eval()
        x = torch.randn(1, 3, 64, 64)
        with torch.no_grad():
            before = model(x)[0].clone()
            model.stages[0].blocks[0].attn.gain.fill_(0.5)
            after = model(x)[0]
        assert not torch.allclose(before, after)


@pytest.mark.parametrize('btype', ['CAPVT', 'CASwin'])
def test_highres_overrides_accept_it(btype):
    with pooled_registered():
        overrides = hr.validate_overrides(stage_attentions='pooled', num_cores='mobile')
        assert overrides['stage_attentions'] == 'pooled'
        cfg = Config(dict(model=dict(backbone=dict(type=btype, arch=TINY))))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            hr.apply_backbone_overrides(cfg, overrides)
        assert cfg.model.backbone.stage_attentions == 'pooled'
        assert any('num_cores has no effect' in str(w.message) for w in caught)  # no core stage
        from mmseg.registry import MODELS

        model = MODELS.build(cfg.model.backbone)
        assert model.stage_attentions == ('pooled',) * 4
        assert quadratic_attention_estimates(model, (97, 131)) == []
        assert hr.backbone_summary(model) == dict(type=btype, stage_attentions=['pooled'] * 4)
    with pytest.raises(ValueError, match='^stage_attentions must'):
        hr.validate_overrides(stage_attentions='pooled')


@pytest.mark.parametrize('family,cls', [('pvt', CAPVT), ('swin', CASwin)])
def test_converter_reports_its_added_keys_as_new(family, cls):
    with pooled_registered():
        torch.manual_seed(0)
        source = cls(arch=TINY, stage_attentions=ORIGINAL[cls]).state_dict()  # plain PVT / Swin
        model = build_backbone(family, arch=TINY, stage_attentions=list(_layout(cls)))
        assert type(model) is cls and model.stage_attentions == _layout(cls)
        result = convert_pyramid(source, model)
    target = model.state_dict()
    params = {k for k, _ in model.named_parameters()}
    expected_new = {k for k in params if k not in source}
    assert expected_new and all(k.endswith('.attn.gain') for k in expected_new)
    assert set(result.new_attention) == expected_new and result.new_other == []
    assert set(result.loaded) == {k for k in target if k in source}
    attr = cls.stages_attr
    assert set(result.unused) == {k for k in source if k not in target}
    assert all(k.startswith((f'{attr}.0.', f'{attr}.1.')) and '.attn.' in k for k in result.unused)
    text = format_summary(result, 'pooled')
    assert 'new: replaced attention, left to the model init: 3 tensors' in text
    assert f'{attr}.*.blocks.*.attn.gain (x3)' in text


# --------------------------------------------------------------------------- analysis
def _pooled_pvt(seed=0):
    torch.manual_seed(seed)
    model = CAPVT(arch=TINY, stage_attentions=_layout(CAPVT)).eval()
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


def test_capture_records_the_matrix_the_layer_uses():
    """Every PooledAttention call is captured (and nothing while unregistered); the
    captured A reproduces the layer's output, gain * (A x), on the block's grid."""
    from mmcirc.analysis.attention_maps import AttentionCapture, find_attention_layers

    with pooled_registered():
        model = _pooled_pvt()
        calls = _attn_calls(model)
        with AttentionCapture(model, forms=('matrix',)) as cap, torch.no_grad():
            model(torch.randn(1, 3, 64, 64))
        assert [n for n, k, _ in find_attention_layers(model, forms=('kernel', 'gather'))] == []
    assert find_attention_layers(model, kinds=None, forms=('matrix',)) == [
        (n, 'sra', m) for n, k, m in find_attention_layers(model) if k == 'sra'
    ]
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

    with pooled_registered():
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


def test_flops_count_it_as_attention_with_its_declared_handle():
    """Per PooledAttention call (B = 1, N tokens, C channels): logsumexp N (the probe's
    handle) + exp N + the (1, N) @ (N, C) product N C; mean, sub and the gain are free.
    Unregistered, its logsumexp is not counted and it is no attention module."""
    from mmcirc.analysis import attention_modules, get_complexity

    img = (3, 64, 64)
    with pooled_registered():
        model = _pooled_pvt()
        res = get_complexity(model, img)
        names = attention_modules(model)
    expected = {}
    for i, (hw, c) in enumerate((((16, 16), 8), ((8, 8), 16))):
        for j in range(TINY['depths'][i]):
            n = hw[0] * hw[1]
            expected[f'layers.{i}.blocks.{j}.attn'] = 2 * n + n * c
    assert [n for n in names if n in expected] == list(expected)
    for name, macs in expected.items():
        assert res['by_module'][name] == macs, name
    assert res['by_operator']['logsumexp'] == sum(
        hw[0] * hw[1] * d for hw, d in (((16, 16), 1), ((8, 8), 2))
    )
    others = [n for n in names if n not in expected]
    assert others and res['attention_flops'] == sum(expected.values()) + sum(
        res['by_module'][n] for n in others
    )
    plain = get_complexity(model, img)
    assert not set(attention_modules(model)) & set(expected)
    assert 'logsumexp' not in plain['by_operator']
    assert plain['flops'] == res['flops'] - res['by_operator']['logsumexp']


def test_attention_tools_see_it(tmp_path, capsys):
    """bccb_score's command scores the pooled stages of a config (with no edit of the
    tool), next to the SRA ones; vis_cores names the kind among those the model has."""
    import json
    import os.path as osp

    from helpers import FIXTURE_CONFIGS

    from mmcirc.cli import bccb_score, vis_cores

    cfg = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')
    layout = "model.backbone.stage_attentions=('pooled','pooled','sra','sra')"
    argv = [cfg, '--demo', 'astronaut', '--size', '64x96', '--cfg-options', layout]
    with pooled_registered():
        assert bccb_score.main(argv + ['--out-dir', str(tmp_path / 'bccb')]) == 0
        with pytest.raises(SystemExit):
            vis_cores.main(argv + ['--out-dir', str(tmp_path / 'cores')])
    (out,) = (tmp_path / 'bccb').iterdir()
    layers = json.loads((out / 'bccb_score.json').read_text())['layers']
    # 64x96 -> stage grids 16x24 and 8x12 (pooled: 1 head, keys = queries), then SRA
    assert [(e['kind'], e['q_grid'], e['k_grid'], e['heads']) for e in layers[:2]] == [
        ('pooled', [16, 24], [16, 24], 1),
        ('pooled', [8, 12], [8, 12], 1),
    ]
    assert [e['kind'] for e in layers[2:]] == ['sra', 'sra']
    assert all(0 < e['distance'][0] < 1 and e['shuffled'][0] > 0 for e in layers[:2])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith('error: ') and 'no core attention layer' in err
    assert '(it has pooled, sra attention)' in err
