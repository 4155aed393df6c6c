"""Every config in configs/ builds its model in its library's registry (pretrained init
switched off) and runs a tiny forward (64 x 96, eval mode) through backbone, neck and
heads; the expected configs are listed here by name.

The forward checks what a wrong channel count, stride or class count would break: the
neck's outputs against the strides the heads' prior generators assume, the heads'
outputs against the classes the config names, and every output finite.
"""

import json
import math
import os
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

import mmcirc  # noqa: F401
from helpers import REPO
from mmcirc.registry import model_registries

# name -> (default_scope, backbone type); a config added or removed must be listed here
EXPECTED = {
    'ca_deit_b_in1k.py': ('mmpretrain', 'CADeiT'),
    'ca_deit_s_in1k.py': ('mmpretrain', 'CADeiT'),
    'ca_deit_s_mask-rcnn_1x_coco.py': ('mmdet', 'CADeiT'),
    'ca_deit_s_upernet_160k_ade20k.py': ('mmseg', 'CADeiT'),
    'ca_deit_t_in1k.py': ('mmpretrain', 'CADeiT'),
    'ca_pvt_l_in1k.py': ('mmpretrain', 'CAPVT'),
    'ca_pvt_l_mask-rcnn_1x_coco.py': ('mmdet', 'CAPVT'),
    'ca_pvt_l_mask-rcnn_3x_coco.py': ('mmdet', 'CAPVT'),
    'ca_pvt_l_retinanet_coco.py': ('mmdet', 'CAPVT'),
    'ca_pvt_m_in1k.py': ('mmpretrain', 'CAPVT'),
    'ca_pvt_m_retinanet_coco.py': ('mmdet', 'CAPVT'),
    'ca_pvt_s_fpn_80k_ade20k.py': ('mmseg', 'CAPVT'),
    'ca_pvt_s_in1k.py': ('mmpretrain', 'CAPVT'),
    'ca_pvt_s_mask-rcnn_1x_coco.py': ('mmdet', 'CAPVT'),
    'ca_pvt_s_mask-rcnn_3x_coco.py': ('mmdet', 'CAPVT'),
    'ca_pvt_s_retinanet_coco.py': ('mmdet', 'CAPVT'),
    'ca_pvt_t-allcirc_fpn_80k_ade20k.py': ('mmseg', 'CAPVT'),
    'ca_pvt_t_fpn_80k_ade20k.py': ('mmseg', 'CAPVT'),
    'ca_pvt_t_in1k.py': ('mmpretrain', 'CAPVT'),
    'ca_pvt_t_retinanet_coco.py': ('mmdet', 'CAPVT'),
    'ca_swin_b_in1k.py': ('mmpretrain', 'CASwin'),
    'ca_swin_b_upernet_160k_ade20k.py': ('mmseg', 'CASwin'),
    'ca_swin_s_in1k.py': ('mmpretrain', 'CASwin'),
    'ca_swin_s_mask-rcnn_1x_coco.py': ('mmdet', 'CASwin'),
    'ca_swin_s_mask-rcnn_3x_coco.py': ('mmdet', 'CASwin'),
    'ca_swin_s_upernet_160k_ade20k.py': ('mmseg', 'CASwin'),
    'ca_swin_t_in1k.py': ('mmpretrain', 'CASwin'),
    'ca_swin_t_mask-rcnn_1x_coco.py': ('mmdet', 'CASwin'),
    'ca_swin_t_mask-rcnn_3x_coco.py': ('mmdet', 'CASwin'),
    'ca_swin_t_upernet_160k_ade20k.py': ('mmseg', 'CASwin'),
    'core_pvt_s_fpn_80k_ade20k.py': ('mmseg', 'CorePVT'),
    'core_pvt_s_in1k.py': ('mmpretrain', 'CorePVT'),
    'core_pvt_s_mask-rcnn_1x_coco.py': ('mmdet', 'CorePVT'),
    'core_pvt_s_mask-rcnn_3x_coco.py': ('mmdet', 'CorePVT'),
    'core_pvt_s_retinanet_coco.py': ('mmdet', 'CorePVT'),
    'core_pvt_t-allcore_fpn_80k_ade20k.py': ('mmseg', 'CorePVT'),
    'core_pvt_t_fpn_80k_ade20k.py': ('mmseg', 'CorePVT'),
    'core_pvt_t_in1k.py': ('mmpretrain', 'CorePVT'),
    'core_pvt_t_mask-rcnn_1x_coco.py': ('mmdet', 'CorePVT'),
    'core_pvt_t_mask-rcnn_3x_coco.py': ('mmdet', 'CorePVT'),
    'core_pvt_t_retinanet_coco.py': ('mmdet', 'CorePVT'),
    'core_swin_s_in1k.py': ('mmpretrain', 'CoreSwin'),
    'core_swin_s_mask-rcnn_1x_coco.py': ('mmdet', 'CoreSwin'),
    'core_swin_s_mask-rcnn_3x_coco.py': ('mmdet', 'CoreSwin'),
    'core_swin_s_upernet_160k_ade20k.py': ('mmseg', 'CoreSwin'),
    'core_swin_t_in1k.py': ('mmpretrain', 'CoreSwin'),
    'core_swin_t_mask-rcnn_1x_coco.py': ('mmdet', 'CoreSwin'),
    'core_swin_t_mask-rcnn_3x_coco.py': ('mmdet', 'CoreSwin'),
    'core_swin_t_upernet_160k_ade20k.py': ('mmseg', 'CoreSwin'),
    'veca_b_linear_40k_ade20k.py': ('mmseg', 'VECAViT'),
    'veca_b_upernet_160k_ade20k.py': ('mmseg', 'VECAViT'),
    'toy/ca_pvt_t_fpn_toy_ade.py': ('mmseg', 'CAPVT'),
    'toy/ca_pvt_t_retinanet_toy.py': ('mmdet', 'CAPVT'),
}
CONFIG_DIR = osp.join(REPO, 'configs')
DATA_ROOTS = {'mmdet': 'data/coco', 'mmseg': 'data/ade/ADEChallengeData2016'}
H, W = 64, 96  # input size of the forward check


def _found():
    """Config files under configs/ (``_base_`` folders excluded), relative names."""
    names = set()
    for root, dirs, files in os.walk(CONFIG_DIR):
        dirs[:] = [d for d in dirs if d != '_base_' and not d.startswith(('.', '__'))]
        names.update(osp.relpath(osp.join(root, f), CONFIG_DIR) for f in files if f.endswith('.py'))
    return names


def test_configs_listed():
    found = _found()
    assert not found - set(EXPECTED), (
        f'configs not listed in EXPECTED: {sorted(found - set(EXPECTED))}'
    )
    assert not set(EXPECTED) - found, f'listed configs missing: {sorted(set(EXPECTED) - found)}'


def _pretrained_refs(node, where='model'):
    """Places in a model config that would read weights from a file or URL."""
    refs = []
    if isinstance(node, dict):
        if node.get('type') == 'Pretrained' or node.get('pretrained'):
            refs.append(where)
        for key, value in node.items():
            refs += _pretrained_refs(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            refs += _pretrained_refs(value, f'{where}[{i}]')
    return refs


def load(path):
    """The config at ``path`` with the backbone's pretrained init switched off."""
    cfg = Config.fromfile(path)
    assert cfg.custom_imports['imports'] == ['mmcirc']
    init = cfg.model.backbone.get('init_cfg')
    if init:  # real recipes start from converted ImageNet weights
        assert init.type == 'Pretrained', init
    cfg.model.backbone.init_cfg = None
    assert not _pretrained_refs(cfg.model), _pretrained_refs(cfg.model)
    return cfg


_last = {}  # the last model built, keyed by its config (1x and 3x recipes share a model)


def build(cfg):
    """Build ``cfg.model`` in the MODELS registry of ``cfg.default_scope``, eval mode."""
    key = (cfg.default_scope, json.dumps(cfg.model.to_dict(), sort_keys=True, default=str))
    if key not in _last:
        _last.clear()
        init_default_scope(cfg.default_scope)
        registry = dict(zip(('mmdet', 'mmseg', 'mmpretrain'), model_registries()))[
            cfg.default_scope
        ]
        torch.manual_seed(0)
        _last[key] = registry.build(cfg.model).eval()
    return _last[key]


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def _assert_finite(out, what):
    tensors = _tensors(out)
    assert tensors, f'{what}: no tensor output'
    for t in tensors:
        assert torch.isfinite(t).all(), f'{what}: non-finite output {tuple(t.shape)}'


def _grid(strides):
    """Feature map sizes of a 64 x 96 input at ``strides`` (ceil: padded convolutions)."""
    return [(math.ceil(H / s), math.ceil(W / s)) for s in strides]


def _strides(generator):
    return [s if isinstance(s, int) else s[0] for s in generator.strides]


def _check_classifier(cfg, model, img):
    from mmpretrain.models import ImageClassifier

    assert isinstance(model, ImageClassifier)
    logits = model(img, mode='tensor')
    assert logits.shape == (1, cfg.model.head.num_classes)
    _assert_finite(logits, 'head')


def _check_segmentor(cfg, model, img):
    from mmseg.models.segmentors import BaseSegmentor

    assert isinstance(model, BaseSegmentor)
    feats = []  # what the heads read: the neck's output, else the backbone's
    last = model.neck if model.with_neck else model.backbone
    hook = last.register_forward_hook(lambda m, i, o: feats.append(o))
    try:
        (sample,) = model.predict(img)  # the test path (whole or slide) back to input size
    finally:
        hook.remove()
    assert sample.seg_logits.data.shape == (cfg.model.decode_head.num_classes, H, W)
    _assert_finite(sample.seg_logits.data, 'decode_head')
    if model.with_auxiliary_head:  # trained beside the decode head: run it too
        heads = model.auxiliary_head
        for head in heads if isinstance(heads, torch.nn.ModuleList) else [heads]:
            out = head(feats[0])
            assert out.shape[:2] == (1, head.num_classes)
            _assert_finite(out, 'auxiliary_head')


def _check_detector(cfg, model, img):
    from mmdet.models.detectors import BaseDetector, TwoStageDetector
    from mmdet.structures import DetDataSample

    assert isinstance(model, BaseDetector)
    if isinstance(model, TwoStageDetector):  # the mask head's cost grows with the proposals
        model.rpn_head.test_cfg.max_per_img = 16
    neck_out = []
    hook = model.neck.register_forward_hook(lambda m, i, o: neck_out.append(o))
    sample = DetDataSample(
        metainfo=dict(
            img_shape=(H, W),
            ori_shape=(H, W),
            pad_shape=(H, W),
            batch_input_shape=(H, W),
            scale_factor=(1.0, 1.0),
        )
    )
    try:
        out = model(img, [sample], mode='tensor')
    finally:
        hook.remove()
    if isinstance(model, TwoStageDetector):
        head, num_classes = model.rpn_head, cfg.model.roi_head.bbox_head.num_classes
        cls_score, bbox_pred, mask_pred = out[-1]  # roi head on the RPN's proposals
        assert cls_score.shape[1] == num_classes + 1 and len(cls_score) > 0
        assert bbox_pred.shape[1] in (4, 4 * num_classes)
        assert mask_pred.shape[1] == num_classes and mask_pred.shape[0] == len(cls_score) <= 16
    else:
        head, num_classes = model.bbox_head, cfg.model.bbox_head.num_classes
        cls_scores, bbox_preds = out
        assert [c.shape[1] for c in cls_scores] == [head.num_base_priors * num_classes] * len(
            cls_scores
        )
        assert [b.shape[-2:] for b in bbox_preds] == _grid(_strides(head.prior_generator))
    # the neck's levels are where the head's anchors assume them
    assert [f.shape[-2:] for f in neck_out[0]] == _grid(_strides(head.prior_generator))
    _assert_finite(out, 'heads')


CHECKS = dict(mmpretrain=_check_classifier, mmseg=_check_segmentor, mmdet=_check_detector)


def check_forward(cfg):
    """Build ``cfg``'s model and run the tiny forward of its task."""
    model = build(cfg)
    torch.manual_seed(0)
    img = torch.randn(1, 3, H, W)
    with torch.no_grad():
        CHECKS[cfg.default_scope](cfg, model, img)


pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_config_builds_and_runs(name):
    scope, backbone = EXPECTED[name]
    cfg = load(osp.join(CONFIG_DIR, name))
    assert (cfg.default_scope, cfg.model.backbone.type) == (scope, backbone)
    if not name.startswith('toy/'):  # real recipes read the standard dataset folders
        dataset = cfg.train_dataloader.dataset
        if scope == 'mmpretrain':
            assert 'data/imagenet' in str(dataset)
        else:
            assert dataset.data_root.rstrip('/') == DATA_ROOTS[scope]
    check_forward(cfg)


BROKEN = {  # one wrong channel count each, where a neck or head reads its input
    'det_neck': (
        'ca_pvt_t_retinanet_coco.py',
        'model = dict(neck=dict(in_channels=[64, 128, 256, 512]))',
    ),
    'seg_neck': (
        'ca_pvt_t_fpn_80k_ade20k.py',
        'model = dict(neck=dict(in_channels=[64, 128, 320, 320]))',
    ),
    'decode_head': (
        'ca_swin_t_upernet_160k_ade20k.py',
        'model = dict(decode_head=dict(in_channels=[96, 192, 384, 384]))',
    ),
    'auxiliary_head': (
        'ca_swin_t_upernet_160k_ade20k.py',
        'model = dict(auxiliary_head=dict(in_channels=768))',
    ),
    'cls_head': ('ca_pvt_t_in1k.py', 'model = dict(head=dict(in_channels=320))'),
}


@pytest.mark.parametrize('part', sorted(BROKEN))
def test_wrong_in_channels_fails(part, tmp_path):
    """The forward check above rejects a config whose channels do not chain (the
    unbroken base passes in test_config_builds_and_runs)."""
    base, override = BROKEN[part]
    path = tmp_path / f'broken_{part}.py'
    path.write_text(f"_base_ = '{osp.join(CONFIG_DIR, base)}'\n{override}\n")
    with pytest.raises(RuntimeError, match='channels|shapes cannot be multiplied'):
        check_forward(load(str(path)))
