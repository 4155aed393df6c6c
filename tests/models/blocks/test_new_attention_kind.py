"""How a new attention kind is added: its block, and a family subclass that takes it.

This file adds a fictitious kind, ``'pooled'`` (every token attends to the patches with
the same weights ``p = softmax_j(mean_c x_j)``, computed in O(N) through ``logsumexp``,
times one new parameter, a per-channel gain initialised to 1; then PVT's / Swin's MLP),
the way a user would, with no edit of mmcirc:

* the operator, ``PooledAttention``, declares its attention itself (``attention_kind``,
  ``attention_form``, ``attention_weights``, and ``flop_handles`` for ``logsumexp``, an
  op mmengine does not price: :mod:`mmcirc.analysis.probes`), so the analysis sees
  it in any model, with nothing registered;
* the block, ``PooledBlock``, is a :class:`~mmcirc.models.blocks.PyramidBlock` with its
  ``kind`` and ``added_keys`` (what a converted checkpoint leaves new);
* a family subclass of CA-PVT / CA-Swin (``PooledPVT``, ``PooledSwin``) adds it to
  ``attention_blocks`` (a kind the family's ``__init__`` does not know gets the
  family's MLP arguments: ``embed_dims``, ``feedforward_channels``, ``drop_rate``,
  ``act_cfg``, ``norm_cfg``, ``ffn_type``; ``block_cfgs`` options add more); registered with
  :func:`mmcirc.registry.register_model` (with the block, for ``block_cfgs`` types), configs
  find it; added to its family with :func:`mmcirc.models.families.register_family`, the
  high-res overrides and the converters find it.

The tests show that the subclass builds and runs with it (``stage_attentions``
short form and ``block_cfgs``) while the base families refuse it, the high-res overrides
accept it, the converters report its added key as new, the attention capture
(``bccb_score`` / ``vis_*``) records its matrix and the FLOP counter (``get_flops``)
counts it as attention with the handle it declares. The expectations are computed
independently of the code under test: key sets from the source and target state dicts,
calls counted with forward hooks, the layer's own output, the BCCB distance and the MACs
by hand. The registrations are removed after each test (the registries are global).
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
from mmcirc.models.convert.pyramid import convert_pyramid
from mmcirc.models.convert.pyramid_target import build_backbone
from mmcirc.models.blocks import PyramidBlock
from mmcirc.models.blocks.pyramid_blocks import TokenFFN, TokenMixFFN, build_ffn
from mmcirc.models.convert import format_summary
from mmcirc.models import families
from mmcirc.registry import model_registries, register_model

TINY = dict(embed_dims=[8, 16, 24, 32], depths=[1, 2, 1, 1], num_heads=[1, 2, 2, 4])
ORIGINAL = {CAPVT: 'sra', CASwin: 'window'}


def _logsumexp_macs(inputs, outputs):
    """mmengine op handle: one exponential per input element (as a softmax)."""
    return Counter({'logsumexp': math.prod(inputs[0].type().sizes())})


class PooledAttention(nn.Module):
    """y_i = gain * sum_j p_j x_j with p = softmax_j(mean_c x_j): A[i, j] = p_j for every
    query i (rank one), computed in O(N); x (B, N, C) -> (B, N, C).

    It declares its attention (the analysis asks the module): kind ``'pooled'``, its
    matrix (B, 1, N, N) with rows p, and the FLOP handle of ``logsumexp``."""

    attention_kind = 'pooled'
    attention_form = 'matrix'
    flop_handles = {'aten::logsumexp': _logsumexp_macs}

    def __init__(self, embed_dims):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(embed_dims))

    def forward(self, x, hw_shape):
        s = x.mean(-1)  # (B, N)
        p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))  # (B, N)
        return (self.gain * (p.unsqueeze(1) @ x)).expand_as(x)  # (B, 1, C) -> (B, N, C)

    def attention_weights(self, args, kwargs, ctx):
        x, hw = args[0], tuple(int(v) for v in args[1])
        p = torch.softmax(x.mean(-1), -1)  # (B, N)
        return dict(weights=p[:, None, None].expand(-1, 1, x.shape[1], -1), q_grid=hw, k_grid=hw)


class PooledBlock(PyramidBlock, BaseModule):
    """``x + attn(LN(x))``, then the family's MLP; ``attn.gain`` is what is new."""

    kind = 'pooled'
    added_keys = ('attn.',)

    def __init__(
        self,
        embed_dims,
        feedforward_channels,
        drop_rate=0.0,
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
            ffn_type, embed_dims, feedforward_channels, drop_rate, drop_path_rate, act_cfg
        )

    def forward(self, x, hw_shape):
        x = x + self.attn(self.norm1(x), hw_shape)
        return self.ffn(self.norm2(x), identity=x)


class PooledPVT(CAPVT):
    """CA-PVT that also takes ``'pooled'`` stages (by default in stages 1-2)."""

    attention_blocks = dict(CAPVT.attention_blocks, pooled=PooledBlock)
    default_attention = 'pooled'


class PooledSwin(CASwin):
    """CA-Swin that also takes ``'pooled'`` stages (by default in stages 1-2)."""

    attention_blocks = dict(CASwin.attention_blocks, pooled=PooledBlock)
    default_attention = 'pooled'


SUBCLASS = {CAPVT: PooledPVT, CASwin: PooledSwin}
REGISTERED = (PooledBlock, PooledPVT, PooledSwin)


@contextlib.contextmanager
def pooled_registered():
    for cls in REGISTERED:
        register_model(cls)
    for cls in SUBCLASS.values():
        families.register_family(cls)
    try:
        yield
    finally:
        for registry in model_registries():
            for cls in REGISTERED:
                registry.module_dict.pop(cls.__name__, None)
        for cls in SUBCLASS.values():
            families.FAMILIES[cls.family].classes.remove(cls)


@pytest.fixture
def registered():
    with pooled_registered():
        yield


def _layout(base):
    return ('pooled', 'pooled', ORIGINAL[base], ORIGINAL[base])


# --------------------------------------------------------------------------- building
@pytest.mark.parametrize('base', [CAPVT, CASwin])
def test_subclass_offers_the_kind_after_the_family_kinds(base):
    assert SUBCLASS[base].attention_choices() == base.attention_choices() + ('pooled',)


@pytest.mark.parametrize('base', [CAPVT, CASwin])
def test_base_family_refuses_the_kind(base, registered):
    assert 'pooled' not in base.attention_choices()
    with pytest.raises(ValueError, match="stage_attentions\\[0\\] must be one of .* got 'pooled'"):
        base(arch=TINY, stage_attentions=_layout(base))


@pytest.mark.parametrize('base', [CAPVT, CASwin])
def test_base_family_refuses_the_block_type(base, registered):
    cfgs = [dict(type='PooledBlock'), None, None, None]
    with pytest.raises(ValueError, match="block_cfgs\\[0\\]: block type must be .* 'PooledBlock'"):
        base(arch=TINY, block_cfgs=cfgs)


def _check_runs(model, base):
    """The first two stages hold PooledBlocks, each called once per forward, no stage
    has a core bank, and the outputs have the pyramid's shapes."""
    model.eval()
    assert model.stage_attentions == _layout(base)
    assert [s.attention for s in model.stages] == list(_layout(base))
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


SHORT_FORMS = dict(
    default=lambda base: dict(),
    attention=lambda base: dict(attention='pooled'),
    stage_attentions=lambda base: dict(stage_attentions=_layout(base)),
)


@pytest.mark.parametrize('form', list(SHORT_FORMS))
@pytest.mark.parametrize('base', [CAPVT, CASwin])
def test_subclass_builds_and_runs_with_the_short_form(base, form):
    """Unregistered too: the short form needs only the class."""
    _check_runs(SUBCLASS[base](arch=TINY, **SHORT_FORMS[form](base)), base)


@pytest.mark.parametrize('base', [CAPVT, CASwin])
def test_subclass_builds_and_runs_with_block_cfgs_types(base, registered):
    """A registered ``type`` decides the stage's kind (``attention`` says circulant)."""
    cfgs = [dict(type='PooledBlock'), dict(type='PooledBlock'), None, None]
    _check_runs(SUBCLASS[base](arch=TINY, attention='circulant', block_cfgs=cfgs), base)


@pytest.mark.parametrize(
    'base,ffn_type,ratio', [(CAPVT, TokenMixFFN, 8), (CASwin, TokenFFN, 4)], ids=['pvt', 'swin']
)
def test_subclass_arguments_reach_its_blocks(base, ffn_type, ratio):
    """A new kind's blocks get the family's MLP (PVT: MixFFN, ratios 8-8-4-4; Swin:
    FFN, ratio 4), as its circulant / core blocks."""
    model = SUBCLASS[base](arch=TINY)
    blocks = [b for s in model.stages[:2] for b in s.blocks]
    assert [type(b.ffn) for b in blocks] == [ffn_type] * 3
    assert [b.ffn.feedforward_channels for b in blocks] == [8 * ratio, 16 * ratio, 16 * ratio]


class HeadedBlock(PooledBlock):
    """A pooled block that also takes the backbone's heads and circulant boundary: it
    says so in ``stage_args``, and the shared builder passes them on unedited."""

    def __init__(self, *args, num_heads=None, boundary=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.taken = (num_heads, boundary)

    @classmethod
    def stage_args(cls, stage):
        return dict(super().stage_args(stage), num_heads=stage.num_heads, boundary=stage.boundary)


@pytest.mark.parametrize('base', [CAPVT, CASwin])
def test_a_kind_takes_the_backbone_options_its_class_names(base):
    headed = type(
        'Headed', (base,), dict(attention_blocks=dict(base.attention_blocks, pooled=HeadedBlock))
    )
    model = headed(arch=TINY, attention='pooled', boundary='zero')
    assert [b.taken for s in model.stages[:2] for b in s.blocks] == [
        (1, 'zero'),
        (2, 'zero'),
        (2, 'zero'),
    ]
    arch = dict(TINY, num_heads=[1, 3, 2, 4])  # 3 does not divide 16: the default check
    with pytest.raises(
        ValueError, match=r"num_heads\[1\]=3 must divide embed_dims\[1\]=16 \(stage 1 uses 'pooled'"
    ):
        headed(arch=arch, attention='pooled')


@pytest.mark.parametrize('base', [CAPVT, CASwin])
def test_gain_reaches_the_output(base):
    torch.manual_seed(0)
    model = SUBCLASS[base](arch=TINY).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        before = model(x)[0].clone()
        model.stages[0].blocks[0].attn.gain.fill_(0.5)
        after = model(x)[0]
    assert not torch.allclose(before, after)


# --------------------------------------------------------------------------- overrides
def test_overrides_accept_the_kind_while_a_family_subclass_is_registered():
    with pooled_registered():
        overrides = hr.validate_overrides(stage_attentions='pooled')
    assert overrides == dict(stage_attentions='pooled')
    with pytest.raises(ValueError, match='^stage_attentions must'):
        hr.validate_overrides(stage_attentions='pooled')


def _apply(btype, **overrides):
    """Apply validated ``overrides`` to a config of ``btype``; returns (cfg, warnings)."""
    cfg = Config(dict(model=dict(backbone=dict(type=btype, arch=TINY))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        hr.apply_backbone_overrides(cfg, hr.validate_overrides(**overrides))
    return cfg, [str(w.message) for w in caught]


@pytest.mark.parametrize('btype', ['PooledPVT', 'PooledSwin'])
def test_overrides_build_the_subclass_with_the_kind(btype, registered):
    from mmseg.registry import MODELS

    cfg, _ = _apply(btype, stage_attentions='pooled')
    assert cfg.model.backbone.stage_attentions == 'pooled'
    model = MODELS.build(cfg.model.backbone)
    assert type(model).__name__ == btype and model.stage_attentions == ('pooled',) * 4
    assert hr.backbone_summary(model) == dict(type=btype, stage_attentions=['pooled'] * 4)


@pytest.mark.parametrize('btype', ['PooledPVT', 'PooledSwin'])
def test_num_cores_override_is_refused_on_the_kind(btype, registered):
    with pytest.raises(ValueError, match='^num_cores does nothing here: '):
        _apply(btype, stage_attentions='pooled', num_cores='mobile')


@pytest.mark.parametrize('base', [CAPVT, CASwin])
def test_the_kind_has_no_quadratic_attention(base):
    """No ``attention_matrix`` (PyramidBlock's default): no high-res memory estimate."""
    model = SUBCLASS[base](arch=TINY, stage_attentions='pooled')
    assert quadratic_attention_estimates(model, (97, 131)) == []


@pytest.mark.parametrize('btype', ['CAPVT', 'CASwin'])
def test_overrides_refuse_the_kind_on_a_base_family(btype, registered):
    with pytest.raises(ValueError, match=f"^stage_attentions: {btype} takes .* got 'pooled'"):
        _apply(btype, stage_attentions='pooled')


# --------------------------------------------------------------------------- converter
def _convert(family, base):
    """(source, target model, result): plain PVT / Swin weights into the pooled layout."""
    torch.manual_seed(0)
    source = base(arch=TINY, stage_attentions=ORIGINAL[base]).state_dict()
    with pooled_registered():
        model = build_backbone(family, arch=TINY, stage_attentions=list(_layout(base)))
        result = convert_pyramid(source, model)
    return source, model, result


FAMILIES = pytest.mark.parametrize('family,base', [('pvt', CAPVT), ('swin', CASwin)])


@FAMILIES
def test_converter_builds_the_registered_subclass(family, base):
    _, model, _ = _convert(family, base)
    assert type(model) is SUBCLASS[base] and model.stage_attentions == _layout(base)


@FAMILIES
def test_converter_reports_its_added_keys_as_new(family, base):
    source, model, result = _convert(family, base)
    expected_new = {k for k, _ in model.named_parameters() if k not in source}
    assert expected_new and all(k.endswith('.attn.gain') for k in expected_new)
    assert set(result.new_attention) == expected_new and result.new_other == []


@FAMILIES
def test_converter_loads_the_rest_and_leaves_the_replaced_attention(family, base):
    source, model, result = _convert(family, base)
    target, attr = model.state_dict(), base.stages_attr
    assert set(result.loaded) == {k for k in target if k in source}
    assert set(result.unused) == {k for k in source if k not in target}
    assert all(k.startswith((f'{attr}.0.', f'{attr}.1.')) and '.attn.' in k for k in result.unused)


@FAMILIES
def test_converter_summary_names_the_new_keys(family, base):
    _, _, result = _convert(family, base)
    text = format_summary(result, 'pooled')
    assert 'new: replaced attention, left to the model init: 3 tensors' in text
    assert f'{base.stages_attr}.*.blocks.*.attn.gain (x3)' in text


# --------------------------------------------------------------------------- analysis
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
