"""Weights through timm: the released files equal the official code's forward (the
official-code fixtures), mmcirc's mmpretrain checkpoints give mmpretrain's logits."""

import os.path as osp

import numpy as np
import pytest
import timm
import torch

import mmcirc.timm  # noqa: F401  (registration)
from helpers import REPO
from timm_variants import SMALL

OFFICIAL = osp.join(REPO, 'tests', 'fixtures', 'official')


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _saved(tmp_path, obj, name='weights.pth'):
    path = str(tmp_path / name)
    torch.save(obj, path)
    return path


def test_released_cadeit_file_equals_the_official_forward(tmp_path):
    fix = torch.load(osp.join(OFFICIAL, 'ca_deit_official.pth'), weights_only=True)
    path = _saved(tmp_path, fix['checkpoint'])  # {'model': state dict}, as released
    model = timm.create_model(
        'ca_deit_tiny',
        pretrained=True,
        pretrained_cfg_overlay=dict(file=path),
        arch=fix['arch'],
        patch_size=fix['patch_size'],
        num_classes=10,
    ).eval()
    with torch.no_grad():
        logits = model(fix['input'])
    assert logits.shape == fix['logits'].shape
    assert _rel(logits, fix['logits']) < 1e-5


def test_released_veca_file_equals_the_official_forward(tmp_path):
    fix = torch.load(osp.join(OFFICIAL, 'veca_official.pth'), weights_only=True)
    path = _saved(tmp_path, fix['checkpoint'])  # {'student': ..., 'config': ...}
    model = timm.create_model(
        'veca_small',
        pretrained=True,
        pretrained_cfg_overlay=dict(file=path),
        arch=fix['arch'],
        patch_size=fix['patch_size'],
        out_channels=fix['out_channels'],
        num_cores=8,
    ).eval()
    for cores in (8, 16):
        model.set_num_cores(cores)
        with torch.no_grad():
            seq = model.forward_features(fix['input'])  # (B, C' + N, D)
            token = model.forward_head(seq, pre_logits=True)
        assert _rel(token, fix[f'global_{cores}']) < 1e-5
        assert _rel(seq[:, cores:], fix[f'patches_{cores}']) < 1e-5


@pytest.mark.parametrize(
    'kwargs,named',
    [
        (dict(), 'out_channels=40'),  # the config's output projection not asked for
        (dict(out_channels=40, rope_shift_coords=0.2), 'rope_shift_coords=0.08'),
    ],
)
def test_veca_file_refuses_a_model_with_other_settings(tmp_path, kwargs, named):
    fix = torch.load(osp.join(OFFICIAL, 'veca_official.pth'), weights_only=True)
    path = _saved(tmp_path, fix['checkpoint'])
    with pytest.raises(ValueError, match=named):
        timm.create_model(
            'veca_small',
            pretrained=True,
            pretrained_cfg_overlay=dict(file=path),
            arch=fix['arch'],
            patch_size=fix['patch_size'],
            **kwargs,
        )


def _runner_checkpoint(model):
    """What mmengine's Runner saves: mmengine and numpy objects beside the weights (which
    torch's plain weights_only loading refuses)."""
    from mmengine.logging import HistoryBuffer

    buf = HistoryBuffer()
    buf.update(1.5)
    return dict(
        meta=dict(epoch=np.int64(3), seed=0),
        state_dict=model.state_dict(),
        message_hub=dict(log_scalars={'train/loss': buf}),
    )


@pytest.mark.parametrize(
    'name,config',
    [
        ('ca_deit_tiny', 'ca_deit_t_in1k.py'),
        ('ca_pvt_tiny', 'ca_pvt_t_in1k.py'),
        ('core_pvt_tiny', 'core_pvt_t_in1k.py'),
        ('ca_swin_tiny', 'ca_swin_t_in1k.py'),
        ('core_swin_tiny', 'core_swin_t_in1k.py'),
    ],
)
def test_same_logits_as_mmpretrain_from_the_same_weights(tmp_path, small, name, config):
    """The ImageNet config (its backbone made small the same way on both sides)."""
    from mmcirc.apis.builder import build_model

    width = small(name).num_features
    options = {
        f'model.backbone.{k}': dict(v, _delete_=True) if isinstance(v, dict) else v
        for k, v in SMALL[name].items()
    }
    options['model.head.in_channels'] = width
    classifier = build_model(osp.join(REPO, 'configs', config), seed=0, cfg_options=options)
    path = _saved(tmp_path, _runner_checkpoint(classifier))
    model = small(name, pretrained=True, pretrained_cfg_overlay=dict(file=path))
    x = torch.randn(2, 3, 64, 80)
    with torch.no_grad():
        ref = classifier(x, mode='tensor')  # backbone -> neck -> LinearClsHead logits
        out = model(x)
    assert out.shape == ref.shape == (2, 1000)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_other_class_count_keeps_the_backbone_and_a_new_classifier(tmp_path, small):
    source = small('ca_pvt_tiny', num_classes=7)
    path = _saved(tmp_path, {'state_dict': source.state_dict()})  # a timm model's own keys
    model = small(
        'ca_pvt_tiny', num_classes=3, pretrained=True, pretrained_cfg_overlay=dict(file=path)
    )
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), source.forward_features(x))
    assert model.get_classifier().out_features == 3


def test_foreign_checkpoint_is_refused(tmp_path, small):
    path = _saved(tmp_path, {'state_dict': {'conv.weight': torch.zeros(2, 2)}})
    with pytest.raises(ValueError, match='not a checkpoint of this model'):
        small('ca_deit_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=path))


@pytest.mark.parametrize(
    'fixture,name,message',
    [
        ('veca_official.pth', 'ca_deit_tiny', 'a VECA checkpoint does not fit CADeiTTimm'),
        ('ca_deit_official.pth', 'veca_small', 'a CA-DeiT checkpoint does not fit VECATimm'),
        ('ca_deit_official.pth', 'ca_pvt_tiny', 'a CA-DeiT checkpoint does not fit PyramidTimm'),
    ],
)
def test_released_file_of_another_family_is_refused(tmp_path, small, fixture, name, message):
    fix = torch.load(osp.join(OFFICIAL, fixture), weights_only=True)
    path = _saved(tmp_path, fix['checkpoint'])
    with pytest.raises(ValueError, match=message):
        small(name, pretrained=True, pretrained_cfg_overlay=dict(file=path))


def test_cadeit_file_of_another_arch_is_refused(tmp_path, small):
    fix = torch.load(osp.join(OFFICIAL, 'ca_deit_official.pth'), weights_only=True)
    path = _saved(tmp_path, fix['checkpoint'])  # 48 wide: the small variant is 16
    with pytest.raises(ValueError, match='arch'):
        small('ca_deit_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=path))


def test_filter_fn_serves_timm_load_checkpoint(tmp_path):
    """timm's own loader (it unwraps ``model`` itself) with the filter as filter_fn."""
    from timm.models import load_checkpoint

    fix = torch.load(osp.join(OFFICIAL, 'ca_deit_official.pth'), weights_only=True)
    path = _saved(tmp_path, fix['checkpoint'])
    model = timm.create_model(
        'ca_deit_tiny', arch=fix['arch'], patch_size=fix['patch_size'], num_classes=10
    ).eval()
    load_checkpoint(model, path, filter_fn=mmcirc.timm.checkpoint_filter_fn)
    with torch.no_grad():
        assert _rel(model(fix['input']), fix['logits']) < 1e-5


def test_grey_input_adapts_the_first_conv_as_timm_does(tmp_path, small):
    """in_chans=1 from a 3-channel checkpoint: timm's rule (the kernel summed over the
    channels), so a grey image gives the logits of its 3-channel copy."""
    source = small('ca_pvt_tiny', num_classes=4)
    path = _saved(tmp_path, {'state_dict': source.state_dict()})
    grey = small(
        'ca_pvt_tiny',
        num_classes=4,
        in_chans=1,
        pretrained=True,
        pretrained_cfg_overlay=dict(file=path),
    )
    x = torch.randn(1, 1, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(grey(x), source(x.expand(-1, 3, -1, -1)), rtol=1e-4, atol=1e-5)


def test_converted_veca_file_loads_and_keeps_the_settings_check(tmp_path):
    """A file of mmcirc's VECA converter (``backbone.*``, the settings in its meta)."""
    from mmcirc.models.convert import convert_file

    fix = torch.load(osp.join(OFFICIAL, 'veca_official.pth'), weights_only=True)
    src = _saved(tmp_path, fix['checkpoint'], 'release.pth')
    out = str(tmp_path / 'converted.pth')
    convert_file('veca', src, out, arch=fix['arch'])
    kwargs = dict(arch=fix['arch'], patch_size=fix['patch_size'], num_cores=8)
    model = timm.create_model(
        'veca_small',
        pretrained=True,
        pretrained_cfg_overlay=dict(file=out),
        out_channels=fix['out_channels'],
        **kwargs,
    ).eval()
    with torch.no_grad():
        token = model.forward_head(model.forward_features(fix['input']), pre_logits=True)
    assert _rel(token, fix['global_8']) < 1e-5
    with pytest.raises(ValueError, match='out_channels=40'):
        timm.create_model(
            'veca_small', pretrained=True, pretrained_cfg_overlay=dict(file=out), **kwargs
        )
