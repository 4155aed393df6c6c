"""The configs of the released isotropic models (CA-DeiT, VECA) build and run a tiny
forward (pretrained init switched off; real model sizes, a 64 x 64 input)."""

import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

import mmcirc  # noqa: F401
from helpers import REPO
from mmcirc.registry import model_registries

CONFIGS = [
    'ca_deit_t_in1k.py',
    'ca_deit_s_in1k.py',
    'ca_deit_b_in1k.py',
    'ca_deit_s_upernet_160k_ade20k.py',
    'veca_b_upernet_160k_ade20k.py',
    'veca_b_linear_40k_ade20k.py',
    'ca_deit_s_mask-rcnn_1x_coco.py',
]
SIZE = 64


def _build(name):
    cfg = Config.fromfile(osp.join(REPO, 'configs', name))
    assert cfg.custom_imports['imports'] == ['mmcirc']
    init_default_scope(cfg.default_scope)
    init = cfg.model.backbone.get('init_cfg')
    if init:  # dense configs load the converted file's backbone
        assert init.type == 'Pretrained' and init.get('prefix') == 'backbone.', init
    cfg.model.backbone.init_cfg = None
    registry = dict(zip(('mmdet', 'mmseg', 'mmpretrain'), model_registries()))[cfg.default_scope]
    return cfg, registry.build(cfg.model).eval()


pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.mark.parametrize('name', CONFIGS)
def test_config_builds_and_runs(name):
    torch.manual_seed(0)
    cfg, model = _build(name)
    img = torch.rand(1, 3, SIZE, SIZE) * 255
    with torch.no_grad():
        if cfg.default_scope == 'mmpretrain':
            out = model(model.data_preprocessor(dict(inputs=[img[0]]))['inputs'], mode='tensor')
            assert out.shape == (1, 1000)
        elif cfg.default_scope == 'mmseg':
            out = model(img, mode='tensor')
            stride = 16 if 'linear' in name else 4  # linear head on stride 16; UperNet: stride 4
            assert out.shape == (1, 150, SIZE // stride, SIZE // stride)
        else:
            from mmdet.structures import DetDataSample

            sample = DetDataSample(
                metainfo=dict(
                    img_shape=(SIZE, SIZE),
                    ori_shape=(SIZE, SIZE),
                    pad_shape=(SIZE, SIZE),
                    scale_factor=(1.0, 1.0),
                )
            )
            feats = model.extract_feat(img)
            assert [f.shape[-1] for f in feats] == [SIZE // s for s in (4, 8, 16, 32)] + [1]
            results = model.predict(img, [sample])
            assert len(results) == 1 and hasattr(results[0], 'pred_instances')
            return
    assert torch.isfinite(out).all()


def test_cadeit_in1k_evaluates_converted_file(tmp_path):
    """The converter's output loads into the in1k config's model with no key left out
    (the whole recipe of 'tools/test.py configs/ca_deit_*_in1k.py FILE')."""
    from mmengine.runner import load_checkpoint

    from mmcirc.models.convert import save_checkpoint
    from mmcirc.models.convert.deit import convert_cadeit_official

    fix = torch.load(
        osp.join(REPO, 'tests', 'fixtures', 'official', 'ca_deit_official.pth'), weights_only=True
    )
    result, _ = convert_cadeit_official(fix['checkpoint'])
    path = save_checkpoint(result, str(tmp_path / 'ca_deit_official.pth'))
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'ca_deit_t_in1k.py'))
    cfg.model.backbone.update(arch=fix['arch'], patch_size=fix['patch_size'])
    cfg.model.head.update(num_classes=10, in_channels=48)
    init_default_scope('mmpretrain')
    model = model_registries()[2].build(cfg.model).eval()
    load_checkpoint(model, path, strict=True)
    with torch.no_grad():  # the classifier on the fixture input (already normalised)
        logits = model(fix['input'], mode='tensor')
    torch.testing.assert_close(
        logits, fix['logits'], rtol=1e-5, atol=1e-5 * float(fix['logits'].abs().max())
    )
