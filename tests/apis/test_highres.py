"""mmcirc.apis.highres (the library): the whole-image config, whole-image inference
against mmseg's own inference_model (pyramid, CA-DeiT, VECA), the banded upsample,
progress. The record and files of one image are tested in
tests/cli/test_infer_highres_record.py, the overrides in tests/apis/test_overrides.py, the
builder in tests/apis/test_builder.py, the memory estimates in
tests/analysis/test_attention_memory.py; the command line (flags, images, PNGs, the
dense-baseline child) in tests/tools/test_infer_highres.py."""

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
from mmcirc.apis import build_model
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


# --------------------------------------------------------------------------- config
def test_whole_mode_is_forced(tmp_path):
    cfg = hr.load_highres_config(
        tiny_config(tmp_path),
        cfg_options={'model.test_cfg': dict(mode='slide', crop_size=(64, 64), stride=(32, 32))},
    )
    assert cfg.model.test_cfg == dict(mode='whole')
    assert cfg.highres_replaced_test_cfg['mode'] == 'slide'


def test_min_input_size_is_the_built_pyramids(tmp_path):
    """A pyramid with spatial-reduction stages states a minimum when it is built; other
    backbones take any size."""
    cfg = hr.load_highres_config(tiny_config(tmp_path, 'ca_pvt_t_fpn_80k_ade20k.py'))
    assert hr.min_input_size(cfg) == build_model(cfg).backbone.min_input_size > 1
    assert hr.min_input_size(hr.load_highres_config(isotropic_config(tmp_path, CADEIT))) == 1


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
    model = build_model(cfg)
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
    model = build_model(hr.load_highres_config(MODELS_UNDER_TEST[which](tmp_path)))
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
    assert 'predict' not in vars(model.decode_head)  # the class's own predict again


def test_progress_must_be_callable(tmp_path):
    model = build_model(hr.load_highres_config(tiny_config(tmp_path)))
    with pytest.raises(TypeError, match='^progress must be'):
        hr.predict_labels(model, _image(33, 45), progress='yes')
