"""A new attention kind needs nothing but its own registered block (issue 11).

This file registers a fictitious block, kind ``'identity'`` (an identity attention
with one new parameter, a per-channel gain initialised to 1, then PVT's / Swin's MLP),
and shows that, with no edit anywhere else, CA-PVT and CA-Swin build and run with it
(``stage_attentions`` short form and ``block_cfgs``), the high-res overrides accept
it, and the converters report its added key as new. The expectations are computed
independently of the code under test: key sets from the source and target state
dicts, calls counted with forward hooks. The registration is removed after each test
(the registries are global).
"""

import contextlib
import warnings

import pytest
import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.config import Config
from mmengine.model import BaseModule

from mmcirc.apis import highres as hr
from mmcirc.models.backbones import CAPVT, CASwin
from mmcirc.models.blocks import PyramidBlock
from mmcirc.models.blocks.base import apply_ffn, build_ffn
from mmcirc.models.convert import build_backbone, convert_pyramid, format_summary
from mmcirc.registry import model_registries, register_model

TINY = dict(embed_dims=[8, 16, 24, 32], depths=[1, 2, 1, 1], num_heads=[1, 2, 2, 4])
ORIGINAL = {CAPVT: 'sra', CASwin: 'window'}


class IdentityAttention(nn.Module):
    """y = gain * x (gain initialised to 1: the identity)."""

    def __init__(self, embed_dims):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(embed_dims))

    def forward(self, x, hw_shape):
        return x * self.gain


class IdentityBlock(PyramidBlock, BaseModule):
    """``x + attn(LN(x))``, then the family's MLP; ``attn.gain`` is what is new."""

    kind = 'identity'
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
        self.attn = IdentityAttention(embed_dims)
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = build_ffn(
            ffn_type, embed_dims, feedforward_channels, 0.0, drop_path_rate, act_cfg
        )

    def forward(self, x, hw_shape):
        x = x + self.attn(self.norm1(x), hw_shape)
        return apply_ffn(self.ffn, self.norm2(x), hw_shape, identity=x)


@contextlib.contextmanager
def identity_registered():
    register_model(IdentityBlock)
    try:
        yield
    finally:
        for registry in model_registries():
            registry.module_dict.pop('IdentityBlock', None)


def _layout(cls):
    return ('identity', 'identity', ORIGINAL[cls], ORIGINAL[cls])


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_kind_is_offered_only_while_registered(cls):
    with identity_registered():
        assert 'identity' in cls.attention_choices()
    assert 'identity' not in cls.attention_choices()
    with pytest.raises(
        ValueError, match="stage_attentions\\[0\\] must be one of .* got 'identity'"
    ):
        cls(arch=TINY, stage_attentions=_layout(cls))


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_backbones_build_and_run_with_it(cls):
    with identity_registered():
        for kwargs in (
            dict(stage_attentions=_layout(cls)),
            dict(attention='identity'),
            dict(block_cfgs=[dict(type='IdentityBlock'), dict(type='IdentityBlock'), None, None]),
        ):
            model = cls(arch=TINY, num_cores_max=8, **kwargs).eval()
            assert model.stage_attentions == _layout(cls)
            assert [s.attention for s in model.stages] == list(_layout(cls))
            calls = []
            for stage in model.stages[:2]:
                for block in stage.blocks:
                    assert type(block) is IdentityBlock
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
    with identity_registered():
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
    with identity_registered():
        overrides = hr.validate_overrides(stage_attentions='identity', num_cores='mobile')
        assert overrides['stage_attentions'] == 'identity'
        cfg = Config(dict(model=dict(backbone=dict(type=btype, arch=TINY))))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            hr.apply_backbone_overrides(cfg, overrides)
        assert cfg.model.backbone.stage_attentions == 'identity'
        assert any('num_cores has no effect' in str(w.message) for w in caught)  # no core stage
        from mmseg.registry import MODELS

        model = MODELS.build(cfg.model.backbone)
        assert model.stage_attentions == ('identity',) * 4
        assert hr.quadratic_attention_estimates(model, (97, 131)) == []
        assert hr.backbone_summary(model) == dict(type=btype, stage_attentions=['identity'] * 4)
    with pytest.raises(ValueError, match='^stage_attentions must'):
        hr.validate_overrides(stage_attentions='identity')


@pytest.mark.parametrize('family,cls', [('pvt', CAPVT), ('swin', CASwin)])
def test_converter_reports_its_added_keys_as_new(family, cls):
    with identity_registered():
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
    text = format_summary(result, 'identity')
    assert 'new: replaced attention, left to the model init: 3 tensors' in text
    assert f'{attr}.*.blocks.*.attn.gain (x3)' in text
