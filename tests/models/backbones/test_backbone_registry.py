"""The named variants build through the MODELS registries of mmdet, mmseg and
mmpretrain by type name, and the backbones plug into each library's models."""

import pytest
import torch

import mmcirc  # noqa: F401  (registration)
from mmcirc.models.backbones import CAPVT, CASwin, CorePVT, CoreSwin

VARIANTS = [
    (cls, arch) for cls in (CAPVT, CorePVT) for arch in ('tiny', 'small', 'medium', 'large')
]
VARIANTS += [(cls, arch) for cls in (CASwin, CoreSwin) for arch in ('tiny', 'small', 'base')]
# depth per stage and stage-1 width of the named variants (PVT v1 / Swin papers)
EXPECTED = {
    'tiny': (2, 2, 2, 2),
    'small': (3, 4, 6, 3),
    'medium': (3, 4, 18, 3),
    'large': (3, 8, 27, 3),
}
SWIN = {
    'tiny': ((2, 2, 6, 2), 96, 3),
    'small': ((2, 2, 18, 2), 96, 3),
    'base': ((2, 2, 18, 2), 128, 4),
}
TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4))


def registries():
    from mmdet.registry import MODELS as DET
    from mmpretrain.registry import MODELS as PRETRAIN
    from mmseg.registry import MODELS as SEG

    return {'mmdet': DET, 'mmseg': SEG, 'mmpretrain': PRETRAIN}


@pytest.mark.parametrize('lib', ['mmdet', 'mmseg', 'mmpretrain'])
@pytest.mark.parametrize('cls,arch', VARIANTS, ids=[f'{c.__name__}-{a}' for c, a in VARIANTS])
def test_named_variant_builds(cls, arch, lib):
    with torch.device('meta'):  # the real constructor, without allocating ~90M floats
        model = registries()[lib].build(dict(type=cls.__name__, arch=arch))
    assert type(model) is cls
    depths = [len(s.blocks) for s in model.stages]
    if cls in (CAPVT, CorePVT):
        assert depths == list(EXPECTED[arch])
        assert model.embed_dims == (64, 128, 320, 512) and model.num_heads == (1, 2, 5, 8)
        assert model.stage_attentions[2:] == ('sra', 'sra')
    else:
        d, c, h = SWIN[arch]
        assert depths == list(d) and model.embed_dims == (c, 2 * c, 4 * c, 8 * c)
        assert model.num_heads == (h, 2 * h, 4 * h, 8 * h)
        assert model.stage_attentions[2:] == ('window', 'window')
    kind = 'core' if cls in (CorePVT, CoreSwin) else 'circulant'
    assert model.stage_attentions[:2] == (kind, kind)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
@pytest.mark.parametrize('name', ['CAPVT', 'CASwin', 'CorePVT', 'CoreSwin'])
def test_scope_prefixed_type(name, scope):
    from mmengine.registry import MODELS as ROOT
    from mmengine.registry import DefaultScope

    with DefaultScope.overwrite_default_scope(None):
        model = ROOT.build(dict(type=f'{scope}.{name}', arch=TINY))
    assert type(model).__name__ == name


@pytest.mark.parametrize(
    'lib,scope', [('mmdet', 'mmseg'), ('mmseg', 'mmpretrain'), ('mmpretrain', 'mmdet')]
)
def test_scope_prefixed_type_from_another_library(lib, scope):
    with torch.device('meta'):
        model = registries()[lib].build(dict(type=f'{scope}.CAPVT', arch='small'))
    assert type(model) is CAPVT


def test_names_do_not_shadow_the_libraries_own_backbones():
    for reg in registries().values():
        assert reg.get('SwinTransformer') is not CASwin
        assert reg.get('CAPVT') is CAPVT and reg.get('CoreSwin') is CoreSwin


def test_real_variant_runs_at_64():
    model = CAPVT(arch='small').eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [
        (1, 64, 16, 16),
        (1, 128, 8, 8),
        (1, 320, 4, 4),
        (1, 512, 2, 2),
    ]


@pytest.mark.parametrize('backbone', ['CAPVT', 'CoreSwin'])
def test_mmpretrain_image_classifier(backbone):
    from mmpretrain.registry import MODELS

    model = MODELS.build(
        dict(
            type='ImageClassifier',
            _scope_='mmpretrain',  # whatever scope a previous test left
            backbone=dict(type=backbone, arch=TINY, out_indices=(3,)),
            neck=dict(type='GlobalAveragePooling'),
            head=dict(
                type='LinearClsHead',
                num_classes=10,
                in_channels=32,
                loss=dict(type='CrossEntropyLoss', loss_weight=1.0),
            ),
        )
    )
    model.init_weights()
    x = torch.randn(2, 3, 64, 64)
    assert model(x, mode='tensor').shape == (2, 10)
    from mmpretrain.structures import DataSample

    samples = [DataSample().set_gt_label(1), DataSample().set_gt_label(3)]
    losses = model(x, samples, mode='loss')
    losses['loss'].backward()
    assert torch.isfinite(losses['loss'])


def test_mmseg_encoder_decoder():
    from mmseg.registry import MODELS

    model = MODELS.build(
        dict(
            type='EncoderDecoder',
            _scope_='mmseg',
            backbone=dict(type='CASwin', arch=TINY),
            neck=dict(type='FPN', in_channels=[8, 16, 24, 32], out_channels=16, num_outs=4),
            decode_head=dict(
                type='FPNHead',
                in_channels=[16, 16, 16, 16],
                in_index=[0, 1, 2, 3],
                feature_strides=[4, 8, 16, 32],
                channels=16,
                num_classes=5,
                norm_cfg=dict(type='BN', requires_grad=True),
                align_corners=False,
                loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
            ),
        )
    )
    model.init_weights()
    out = model(torch.randn(2, 3, 97, 131), mode='tensor')
    assert out.shape[:2] == (2, 5)


def test_mmdet_fpn_neck():
    from mmdet.registry import MODELS

    backbone = MODELS.build(dict(type='CorePVT', arch=TINY, num_cores='mobile', frozen_stages=1))
    neck = MODELS.build(dict(type='FPN', in_channels=[8, 16, 24, 32], out_channels=16, num_outs=5))
    feats = neck(backbone(torch.randn(1, 3, 113, 257)))
    assert [tuple(f.shape[-2:]) for f in feats] == [(29, 65), (15, 33), (8, 17), (4, 9), (2, 5)]
