"""mmcirc.apis.highres (the library): overrides (pyramids, CA-DeiT, VECA), whole-image
inference against mmseg's own inference_model, the banded upsample, progress, memory
estimates. The command line (flags, images, PNGs, the dense-baseline child) is tested in
tests/tools/test_infer_highres.py."""

import math
import os.path as osp

import cv2
import numpy as np
import pytest
import torch

from helpers import CADEIT_UPERNET as CADEIT
from helpers import REPO
from helpers import VECA_UPERNET as VECA
from helpers import tiny_isotropic_config as isotropic_config
from mmcirc.apis import highres as hr

TINY = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])
                  {extra}),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8))
"""


def tiny_config(tmp_path, base='ca_pvt_t-allcirc_fpn_80k_ade20k.py', extra='', name='tiny.py'):
    """A thin config over one of configs/ with a tiny backbone and head."""
    path = tmp_path / name
    path.write_text(
        TINY.format(base=osp.join(REPO, 'configs', base), extra=(', ' + extra) if extra else '')
    )
    return str(path)


def _image(h=97, w=131, seed=0):
    rng = np.random.RandomState(seed)
    img = cv2.resize(
        rng.randint(0, 256, (7, 9, 3)).astype(np.uint8), (w, h), interpolation=cv2.INTER_CUBIC
    )
    return img


def _sharpen_head(model):
    """Random init gives nearly constant predictions; spread the classifier out so the
    comparison covers many labels."""
    torch.manual_seed(0)
    with torch.no_grad():
        model.decode_head.conv_seg.weight.normal_(0, 2.0)


# --------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    'kwargs,param,allowed',
    [
        (dict(boundary='wrap'), 'boundary', "('circular', 'zero')"),
        (dict(scale='log'), 'scale', "('sqrt_n', 'n')"),
        (dict(num_cores='huge'), 'num_cores', "('mobile', 'edge', 'server')"),
        (dict(num_cores='0'), 'num_cores', "('mobile', 'edge', 'server')"),
        (dict(stage_attentions='dense'), 'stage_attentions', "'circulant', 'core', 'sra'"),
    ],
)
def test_unknown_override_names_parameter_and_values(kwargs, param, allowed):
    with pytest.raises(ValueError) as err:
        hr.validate_overrides(**kwargs)
    assert str(err.value).startswith(f'{param} must') and allowed in str(err.value)
    assert '--' not in str(err.value)


def test_validate_overrides_values():
    assert hr.validate_overrides(num_cores='8', boundary='zero', scale='n') == dict(
        num_cores=8, boundary='zero', scale='n'
    )
    assert hr.validate_overrides(num_cores='mobile', scale='0.5') == dict(
        num_cores='mobile', scale=0.5
    )
    assert hr.validate_overrides(stage_attentions='core,sra,core,sra') == dict(
        stage_attentions=('core', 'sra', 'core', 'sra')
    )


def test_num_cores_above_bank_is_an_error(tmp_path):
    with pytest.raises(ValueError, match='^num_cores must .*num_cores_max=64'):
        hr.load_highres_config(
            tiny_config(tmp_path, 'core_pvt_t-allcore_fpn_80k_ade20k.py'),
            overrides=dict(num_cores=65),
        )


def test_whole_mode_is_forced(tmp_path):
    cfg = hr.load_highres_config(
        tiny_config(tmp_path),
        cfg_options={'model.test_cfg': dict(mode='slide', crop_size=(64, 64), stride=(32, 32))},
    )
    assert cfg.model.test_cfg == dict(mode='whole')
    assert cfg.highres_replaced_test_cfg['mode'] == 'slide'


# --------------------------------------------------------------------------- overrides
def test_overrides_reach_every_stage_and_block(tmp_path):
    cfg = hr.load_highres_config(
        tiny_config(tmp_path, 'core_pvt_t-allcore_fpn_80k_ade20k.py'),
        overrides=hr.validate_overrides(
            num_cores='5',
            boundary='zero',
            scale='n',
            stage_attentions='core,circulant,core,circulant',
        ),
    )
    model = hr.build_segmentor(cfg)
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
    hr.predict_labels(model, _image(33, 45))
    for h in hooks:
        h.remove()
    assert seen == [5, 5]
    summary = hr.backbone_summary(bb)
    assert summary['num_cores'] == 5 and summary['boundary'] == 'zero' and summary['scale'] == 'n'


def test_preset_num_cores(tmp_path):
    cfg = hr.load_highres_config(
        tiny_config(tmp_path, 'core_pvt_t-allcore_fpn_80k_ade20k.py'),
        overrides=dict(num_cores='mobile'),
    )
    model = hr.build_segmentor(cfg)
    assert [s.num_cores for s in model.backbone.layers] == [8, 8, 8, 8]


# --------------------------------------------------------------------------- inference
@pytest.mark.parametrize(
    'shape', [(97, 131), (64, 50), (8, 8)]
)  # generic / channel-vectorised kernels
@pytest.mark.parametrize('channels', [150, 37, 16, 5])
def test_upsample_argmax_equals_full(shape, channels):
    from mmseg.models.utils import resize

    torch.manual_seed(0)
    logits = torch.randn(1, channels, (shape[0] + 3) // 4, (shape[1] + 3) // 4)
    if channels > 20:
        logits[:, 20] = logits[:, 3]  # exact ties across bands: the first index must win
        logits[:, 5] = logits[:, 3]
    full = resize(logits, size=shape, mode='bilinear', align_corners=False).argmax(1)[0]
    for band in (16, 32, 48, 160):
        assert torch.equal(hr.upsample_argmax(logits, shape, False, band=band), full)
    with pytest.raises(ValueError, match='multiple of 16'):
        hr.upsample_argmax(logits, shape, False, band=5)


MODELS_UNDER_TEST = {
    'ca_pvt': tiny_config,
    'ca_deit': lambda tmp_path: isotropic_config(tmp_path, CADEIT),
    'veca': lambda tmp_path: isotropic_config(tmp_path, VECA),
}


@pytest.mark.parametrize('which', list(MODELS_UNDER_TEST))
def test_predict_labels_equals_mmseg_inference_model(tmp_path, which):
    """Our whole-image path == mmseg's inference_model (its own pipeline, without the
    config's Resize, and its test_step) on the same model and image file: an
    all-circulant pyramid and the isotropic CA-DeiT and VECA (UperNet, multi-level neck)."""
    from mmseg.apis import inference_model

    cfg = hr.load_highres_config(MODELS_UNDER_TEST[which](tmp_path))
    model = hr.build_segmentor(cfg)
    _sharpen_head(model)
    img = _image()
    path = str(tmp_path / 'img.png')
    cv2.imwrite(path, img)
    model.cfg.test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackSegInputs')]
    ref = inference_model(model, path).pred_sem_seg.data[0].numpy()
    assert ref.shape == (97, 131) and len(np.unique(ref)) > 5
    for mode in ('banded', 'mmseg'):
        labels, times = hr.predict_labels(model, cv2.imread(path, cv2.IMREAD_COLOR), upsample=mode)
        assert times['upsample'] == mode and times['time_s'] > 0
        np.testing.assert_array_equal(labels, ref)


@pytest.mark.parametrize(
    'which,units',
    [
        ('ca_pvt', ['backbone stage %d/4' % i for i in (1, 2, 3, 4)]),
        ('ca_deit', ['backbone block 1/2', 'backbone block 2/2']),
    ],
)
def test_progress_once_per_stage_neck_head_and_band(tmp_path, which, units):
    """One call per backbone stage (4 in the tiny CA-PVT) or block (2 in the tiny
    CA-DeiT), the neck, the head and each band of 16 of the 150 ADE20K classes, in
    order; the labels do not change."""
    model = hr.build_segmentor(hr.load_highres_config(MODELS_UNDER_TEST[which](tmp_path)))
    img = _image(40, 56)
    calls = []
    labels, _ = hr.predict_labels(model, img, progress=lambda *a: calls.append(a))
    bands = math.ceil(150 / 16)
    names = (
        units
        + ['neck', 'decode head']
        + [f'upsample band {k}/{bands}' for k in range(1, bands + 1)]
    )
    assert calls == [(n, i + 1, len(names)) for i, n in enumerate(names)]
    quiet, _ = hr.predict_labels(model, img)
    np.testing.assert_array_equal(labels, quiet)
    calls.clear()
    hr.predict_labels(model, img, upsample='mmseg', progress=lambda *a: calls.append(a))
    names = units + ['neck', 'decode head', 'upsample']
    assert calls == [(n, i + 1, len(names)) for i, n in enumerate(names)]
    assert not any(m._forward_hooks for _, m in hr.progress_units(model))  # hooks removed


def test_progress_must_be_callable(tmp_path):
    model = hr.build_segmentor(hr.load_highres_config(tiny_config(tmp_path)))
    with pytest.raises(TypeError, match='^progress must be'):
        hr.predict_labels(model, _image(33, 45), progress='yes')


# --------------------------------------------------------------------------- isotropic models
def test_veca_num_cores_reaches_every_block(tmp_path):
    """C' = 8 of VECA's bank of 16: every block's attention gets 8 cores, and its
    sequence is 8 cores + the 3 x 3 patches of a 33 x 45 image (padded to 48 x 48)."""
    cfg = hr.load_highres_config(
        isotropic_config(tmp_path, VECA), overrides=hr.validate_overrides(num_cores='8')
    )
    assert cfg.model.backbone.num_cores == 8
    model = hr.build_segmentor(cfg)
    seen = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda mod, args: seen.append((args[3], args[0].shape[1])))
        for b in model.backbone.blocks
    ]
    hr.predict_labels(model, _image(33, 45))
    for h in hooks:
        h.remove()
    assert seen == [(8, 8 + 3 * 3)] * 2
    assert hr.backbone_summary(model.backbone) == dict(
        type='VECAViT', num_cores=8, num_cores_max=16
    )
    assert hr.quadratic_attention_estimates(model.backbone, (4096, 4096)) == []


def test_veca_preset_num_cores(tmp_path):
    cfg = hr.load_highres_config(
        isotropic_config(tmp_path, VECA), overrides=dict(num_cores='mobile')
    )
    assert hr.build_segmentor(cfg).backbone.num_cores == 8


@pytest.mark.parametrize(
    'value', ['12', '24', 'edge']
)  # not a chunk multiple; beyond the bank; preset 32
def test_veca_num_cores_outside_its_bank_is_an_error(tmp_path, value):
    with pytest.raises(ValueError) as err:
        hr.load_highres_config(
            isotropic_config(tmp_path, VECA), overrides=hr.validate_overrides(num_cores=value)
        )
    msg = str(err.value)
    assert msg.startswith('num_cores must') and '16' in msg and '\n' not in msg


def test_cadeit_boundary_and_scale_reach_every_block(tmp_path):
    cfg = hr.load_highres_config(
        isotropic_config(tmp_path, CADEIT),
        overrides=hr.validate_overrides(boundary='zero', scale='n'),
    )
    model = hr.build_segmentor(cfg)
    attns = [b.attn for b in model.backbone.blocks]
    assert len(attns) == 2 and all(a.boundary == 'zero' and a.scale == 'n' for a in attns)
    assert hr.backbone_summary(model.backbone) == dict(type='CADeiT', boundary='zero', scale='n')


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
        hr.load_highres_config(isotropic_config(tmp_path, base), overrides=overrides)
    assert str(err.value).startswith(f'{key} does not apply to') and str(err.value).endswith(
        f'takes {takes}'
    )


def test_overrides_need_a_backbone_that_takes_them(tmp_path):
    with pytest.raises(
        ValueError, match="need an mmcirc backbone .*'CAPVT'.*'VECAViT'.*the config has 'ResNetV1c'"
    ):
        hr.load_highres_config(
            osp.join(REPO, 'configs', 'ca_pvt_t_fpn_80k_ade20k.py'),
            cfg_options={'model.backbone': dict(_delete_=True, type='ResNetV1c')},
            overrides=dict(boundary='zero'),
        )


def test_palette_from_config_without_checkpoint(tmp_path):
    model = hr.build_segmentor(hr.load_highres_config(tiny_config(tmp_path)))
    from mmseg.datasets import ADE20KDataset

    assert model.dataset_meta['classes'] == ADE20KDataset.METAINFO['classes']
    assert model.dataset_meta['palette'] == [list(p) for p in ADE20KDataset.METAINFO['palette']]


# --------------------------------------------------------------------------- memory
@pytest.mark.parametrize(
    'base,attn',
    [('ca_pvt_t-allcirc_fpn_80k_ade20k.py', 'sra'), ('ca_swin_t_upernet_160k_ade20k.py', 'window')],
)
def test_stage_grids_match_forward(tmp_path, base, attn):
    from mmengine.config import Config
    from mmseg.registry import MODELS

    bcfg = Config.fromfile(osp.join(REPO, 'configs', base)).model.backbone
    bcfg.update(init_cfg=None, stage_attentions=attn)
    bcfg.arch = dict(embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])
    bb = MODELS.build(bcfg).eval()
    with torch.no_grad():
        outs = bb(torch.zeros(1, 3, 97, 131))
    assert hr._stage_grids(bb, (97, 131)) == [tuple(o.shape[2:]) for o in outs]
    est = hr.quadratic_attention_estimates(bb, (97, 131))
    assert [e['attention'] for e in est] == [attn] * 4


def test_quadratic_warning_only_where_it_does_not_fit(tmp_path):
    from mmseg.registry import MODELS

    paper = hr.load_highres_config(tiny_config(tmp_path, 'ca_pvt_t_fpn_80k_ade20k.py'))
    paper.model.backbone.init_cfg = None
    bb = MODELS.build(paper.model.backbone)
    assert bb.stage_attentions == ('circulant', 'circulant', 'sra', 'sra')
    est = hr.quadratic_attention_estimates(bb, (4096, 4096))
    # stage 3: 256 x 256 tokens, sr 2 -> 128 x 128 keys, 1 head, scores + softmax
    assert est[0]['stage'] == 3 and est[0]['queries'] == 65536 and est[0]['keys'] == 16384
    assert est[0]['bytes'] == 2 * 4 * 65536 * 16384
    assert hr.quadratic_warning(bb, (97, 131)) is None
    warn = hr.quadratic_warning(bb, (8192, 8192))
    assert warn.startswith('WARNING:') and 'quadratic' in warn and 'stage 3' in warn
    assert '\n' not in warn
    allcirc = hr.load_highres_config(tiny_config(tmp_path))
    allcirc.model.backbone.init_cfg = None
    assert hr.quadratic_warning(MODELS.build(allcirc.model.backbone), (8192, 8192)) is None
