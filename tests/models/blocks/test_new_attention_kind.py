"""How a new attention kind is added: its block, and a family subclass that takes it
(the kind ``'pooled'`` of tests/pooled_kind.py, added with no edit of mmcirc).

The subclass builds and runs with it (``stage_attentions`` short form and
``block_cfgs``) while the base families refuse it, the high-res overrides accept it and
the converters report its added key as new (tests/analysis/test_new_attention_kind_analysis.py:
the attention capture and the FLOP counter). The expectations are computed independently
of the code under test: key sets from the source and target state dicts, calls counted
with forward hooks, the layer's own output.
"""

import warnings

import pytest
import torch
from mmengine.config import Config
from pooled_kind import (
    ORIGINAL,
    SUBCLASS,
    TINY,
    PooledBlock,
    pooled_registered,
)


@pytest.fixture
def registered():
    """The pooled kind registered for the test (tests/pooled_kind.py)."""
    with pooled_registered():
        yield


from mmcirc import apis as hr
from mmcirc.analysis.attention_memory import quadratic_attention_estimates
from mmcirc.models.backbones import CAPVT, CASwin
from mmcirc.models.blocks.pyramid_blocks import TokenFFN, TokenMixFFN
from mmcirc.models.convert import format_summary
from mmcirc.models.convert.pyramid import convert_pyramid
from mmcirc.models.convert.pyramid_target import build_backbone


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
