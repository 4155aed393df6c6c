"""mmcirc.apis.overrides: the backbone overrides (num_cores, boundary, scale,
stage_attentions) checked and written into pyramids, CA-DeiT, VECA and bare backbone
configs before building; what the built backbone then runs with (forward hooks) and
reports."""

import os.path as osp

import pytest
import torch
from mmengine.config import Config

from helpers import CADEIT_UPERNET as CADEIT
from helpers import REPO
from helpers import VECA_UPERNET as VECA
from helpers import tiny_isotropic_config as isotropic_config
from mmcirc.apis import build_model, load_highres_config
from mmcirc.apis import overrides as ov
from mmcirc.ops.core import CORE_PRESETS

TINY = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8))
"""
ALLCORE = 'core_pvt_t-allcore_fpn_80k_ade20k.py'


def tiny_config(tmp_path, base='ca_pvt_t-allcirc_fpn_80k_ade20k.py'):
    """A thin config over one of configs/ with a tiny backbone and head."""
    path = tmp_path / 'tiny.py'
    path.write_text(TINY.format(base=osp.join(REPO, 'configs', base)))
    return str(path)


def _forward_backbone(model, h=33, w=45):
    with torch.no_grad():
        return model.extract_feat(torch.zeros(1, 3, h, w))


# --------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    'kwargs,param,allowed',
    [
        (dict(boundary='wrap'), 'boundary', "('circular', 'zero')"),
        (dict(scale='log'), 'scale', "('sqrt_n', 'n')"),
        (dict(scale='-1'), 'scale', "('sqrt_n', 'n')"),
        (dict(num_cores='huge'), 'num_cores', "('mobile', 'edge', 'server')"),
        (dict(num_cores='0'), 'num_cores', "('mobile', 'edge', 'server')"),
        (dict(num_cores='-3'), 'num_cores', "('mobile', 'edge', 'server')"),
        (dict(num_cores=True), 'num_cores', "('mobile', 'edge', 'server')"),
        (dict(stage_attentions='dense'), 'stage_attentions', "'circulant', 'core', 'sra'"),
        (dict(stage_attentions='core,dense'), 'stage_attentions', "'circulant', 'core', 'sra'"),
    ],
)
def test_unknown_override_names_parameter_and_values(kwargs, param, allowed):
    with pytest.raises(ValueError) as err:
        ov.validate_overrides(**kwargs)
    msg = str(err.value)
    assert msg.startswith(f'{param} must') and allowed in msg
    assert '--' not in msg and '\n' not in msg


def test_validate_overrides_values():
    assert ov.validate_overrides(num_cores='8', boundary='zero', scale='n') == dict(
        num_cores=8, boundary='zero', scale='n'
    )
    assert ov.validate_overrides(num_cores='mobile', scale='0.5') == dict(
        num_cores='mobile', scale=0.5
    )
    assert ov.validate_overrides(stage_attentions='core,sra,core,sra') == dict(
        stage_attentions=('core', 'sra', 'core', 'sra')
    )
    assert ov.validate_overrides() == {}


def test_validated_overrides_pass_again_unchanged():
    once = ov.validate_overrides(num_cores='16', scale='0.25', stage_attentions='core,sra')
    assert ov.validate_overrides(**once) == once


def test_num_cores_presets_are_the_one_table():
    assert ov.BACKBONE_OVERRIDES['num_cores'] == tuple(CORE_PRESETS)


# --------------------------------------------------------------------------- pyramids
def test_num_cores_above_bank_is_an_error(tmp_path):
    with pytest.raises(ValueError, match='^num_cores must .*num_cores_max=64'):
        load_highres_config(tiny_config(tmp_path, ALLCORE), overrides=dict(num_cores=65))


def test_overrides_reach_every_stage_and_block(tmp_path):
    cfg = load_highres_config(
        tiny_config(tmp_path, ALLCORE),
        overrides=ov.validate_overrides(
            num_cores='5',
            boundary='zero',
            scale='n',
            stage_attentions='core,circulant,core,circulant',
        ),
    )
    model = build_model(cfg)
    bb = model.backbone
    assert bb.stage_attentions == ('core', 'circulant', 'core', 'circulant')
    core_stages = [s for s in bb.layers if s.attention == 'core']
    circ_blocks = [m for m in bb.modules() if type(m).__name__ == 'CirculantBlock']
    assert len(core_stages) == 2 and len(circ_blocks) == 2
    assert all(s.num_cores == 5 for s in core_stages) and bb.num_cores == 5
    assert all(b.attn.boundary == 'zero' and b.attn.scale == 'n' for b in circ_blocks)
    # and the forward really runs with C' = 5 cores in every core block
    seen = []
    hooks = [
        m.attn.register_forward_pre_hook(lambda mod, args: seen.append(args[1].shape[1]))
        for m in bb.modules()
        if type(m).__name__ == 'CoreBlock'
    ]
    _forward_backbone(model)
    for h in hooks:
        h.remove()
    assert seen == [5, 5]
    summary = ov.backbone_summary(bb)
    assert summary['num_cores'] == 5 and summary['boundary'] == 'zero' and summary['scale'] == 'n'


def test_preset_num_cores(tmp_path):
    cfg = load_highres_config(tiny_config(tmp_path, ALLCORE), overrides=dict(num_cores='mobile'))
    model = build_model(cfg, init_weights=False)
    assert [s.num_cores for s in model.backbone.layers] == [8, 8, 8, 8]


def test_an_override_the_stages_do_not_use_is_refused(tmp_path):
    cfg = Config.fromfile(tiny_config(tmp_path))  # all circulant: no core stage
    before = cfg.model.backbone.get('num_cores')
    with pytest.raises(ValueError, match=r"^num_cores does nothing here: .*of kind \('core',\)"):
        ov.apply_backbone_overrides(cfg, dict(num_cores=4))
    assert cfg.model.backbone.get('num_cores') == before


def test_a_bare_backbone_config_takes_overrides():
    cfg = Config(dict(model=dict(type='CorePVT', num_cores_max=8)))
    ov.apply_backbone_overrides(cfg, dict(num_cores='6'))
    assert cfg.model.num_cores == 6
    circ = Config(dict(model=dict(type='CAPVT')))
    ov.apply_backbone_overrides(circ, dict(boundary='zero'))
    assert circ.model.boundary == 'zero'
    with pytest.raises(ValueError, match=r'^num_cores must .*num_cores_max=8\]'):
        ov.apply_backbone_overrides(cfg, dict(num_cores=9))


def test_unknown_override_keys_are_an_error():
    cfg = Config(dict(model=dict(type='CorePVT')))
    with pytest.raises(ValueError, match=r"^overrides must be among .*got \['cores'\]"):
        ov.apply_backbone_overrides(cfg, dict(cores=8))


# --------------------------------------------------------------------------- isotropic models
def test_veca_num_cores_reaches_every_block(tmp_path):
    """C' = 8 of VECA's bank of 16: every block's attention gets 8 cores, and its
    sequence is 8 cores + the 3 x 3 patches of a 33 x 45 image (padded to 48 x 48)."""
    cfg = load_highres_config(
        isotropic_config(tmp_path, VECA), overrides=ov.validate_overrides(num_cores='8')
    )
    assert cfg.model.backbone.num_cores == 8
    model = build_model(cfg)
    seen = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda mod, args: seen.append((args[3], args[0].shape[1])))
        for b in model.backbone.blocks
    ]
    with torch.no_grad():  # the preprocessor pads 33 x 45 to its size divisor
        data = model.data_preprocessor(dict(inputs=[torch.zeros(3, 33, 45)]))
        model.extract_feat(data['inputs'])
    for h in hooks:
        h.remove()
    assert seen == [(8, 8 + 3 * 3)] * 2
    assert ov.backbone_summary(model.backbone) == dict(
        type='VECAViT', num_cores=8, num_cores_max=16
    )


def test_veca_preset_num_cores(tmp_path):
    cfg = load_highres_config(isotropic_config(tmp_path, VECA), overrides=dict(num_cores='mobile'))
    assert build_model(cfg, init_weights=False).backbone.num_cores == 8


@pytest.mark.parametrize(
    'value', ['12', '24', 'edge']
)  # not a chunk multiple; beyond the bank; preset 32
def test_veca_num_cores_outside_its_bank_is_an_error(tmp_path, value):
    with pytest.raises(ValueError) as err:
        load_highres_config(
            isotropic_config(tmp_path, VECA), overrides=ov.validate_overrides(num_cores=value)
        )
    msg = str(err.value)
    assert msg.startswith('num_cores must') and '16' in msg and '\n' not in msg


def test_cadeit_boundary_and_scale_reach_every_block(tmp_path):
    cfg = load_highres_config(
        isotropic_config(tmp_path, CADEIT),
        overrides=ov.validate_overrides(boundary='zero', scale='n'),
    )
    model = build_model(cfg, init_weights=False)
    attns = [b.attn for b in model.backbone.blocks]
    assert len(attns) == 2 and all(a.boundary == 'zero' and a.scale == 'n' for a in attns)
    assert ov.backbone_summary(model.backbone) == dict(type='CADeiT', boundary='zero', scale='n')


@pytest.mark.parametrize(
    'base,overrides,takes',
    [
        (VECA, dict(boundary='zero'), "('num_cores',)"),
        (CADEIT, dict(num_cores=8), "('boundary', 'scale')"),
        (CADEIT, dict(stage_attentions='core'), "('boundary', 'scale')"),
    ],
)
def test_override_the_backbone_does_not_take_is_an_error(tmp_path, base, overrides, takes):
    (key,) = overrides
    with pytest.raises(ValueError) as err:
        load_highres_config(isotropic_config(tmp_path, base), overrides=overrides)
    assert str(err.value).startswith(f'{key} does not apply to') and str(err.value).endswith(
        f'takes {takes}'
    )


def test_overrides_need_a_backbone_that_takes_them(tmp_path):
    with pytest.raises(
        ValueError, match="need an mmcirc backbone .*'CAPVT'.*'VECAViT'.*the config has 'ResNetV1c'"
    ):
        load_highres_config(
            osp.join(REPO, 'configs', 'ca_pvt_t_fpn_80k_ade20k.py'),
            cfg_options={'model.backbone': dict(_delete_=True, type='ResNetV1c')},
            overrides=dict(boundary='zero'),
        )
