"""mmcirc.apis.builder: the one model builder (detectors, segmentors, classifiers, bare
backbones) against the libraries' own init_detector / init_model, strip_pretrained,
seeded random weights, checkpoints through the safe loader, dataset_meta."""

import os.path as osp
import pickle
import re

import pytest
import torch
from mmengine.config import Config

from helpers import FIXTURE_CONFIGS, REPO
from mmcirc.apis.builder import build_model, load_model_config, strip_pretrained

DET = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')
SEG = osp.join(FIXTURE_CONFIGS, 'ca_pvt_fpn_tiny.py')
CLS = osp.join(FIXTURE_CONFIGS, 'core_pvt_cls_tiny.py')


def _library_init(scope):
    """The library's own builder: mmdet's init_detector, mmseg's / mmpretrain's init_model."""
    if scope == 'mmdet':
        from mmdet.apis import init_detector

        return init_detector
    if scope == 'mmseg':
        from mmseg.apis import init_model

        return init_model
    from mmpretrain.apis import init_model

    return init_model


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize(
    'config,kind',
    [(DET, 'RetinaNet'), (SEG, 'EncoderDecoder'), (CLS, 'ImageClassifier')],
)
def test_build_model_equals_the_library_init_with_a_checkpoint(tmp_path, config, kind):
    """A detector, a segmentor and a classifier: the same class, weights, preprocessor
    and tensor-mode outputs as the library's own init_* on the same checkpoint."""
    cfg = Config.fromfile(config)
    model = build_model(cfg, seed=0)
    assert type(model).__name__ == kind and not model.training
    with torch.no_grad():  # weights that differ from any init
        for p in model.parameters():
            p.normal_()
    ckpt = tmp_path / 'w.pth'
    torch.save(dict(state_dict=model.state_dict(), meta={}), ckpt)
    ours = build_model(config, str(ckpt))
    ref = _library_init(cfg.default_scope)(Config.fromfile(config), str(ckpt), device='cpu')
    assert type(ours) is type(ref)
    _assert_same_weights(ours, ref)
    _assert_same_weights(ours, model)
    assert type(ours.data_preprocessor) is type(ref.data_preprocessor)
    x = torch.rand(1, 3, 64, 64) * 255
    with torch.no_grad():
        out = ours.forward(ours.data_preprocessor(dict(inputs=[x[0]]))['inputs'], mode='tensor')
        expected = ref.forward(ref.data_preprocessor(dict(inputs=[x[0]]))['inputs'], mode='tensor')
    flat = lambda o: [o] if torch.is_tensor(o) else [t for i in o for t in flat(i)]  # noqa: E731
    assert len(flat(out)) == len(flat(expected)) > 0
    for a, b in zip(flat(out), flat(expected)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_classifier_takes_the_top_level_data_preprocessor():
    """mmpretrain configs keep ``data_preprocessor`` at the top level (the Runner and
    mmpretrain's init_model move it into the model): num_classes=3 from the fixture."""
    model = build_model(CLS, init_weights=False)
    cfg = Config.fromfile(CLS)
    assert cfg.model.get('data_preprocessor') is None and cfg.data_preprocessor.num_classes == 3
    assert model.data_preprocessor.__class__.__name__ == 'ClsDataPreprocessor'
    assert model.head.num_classes == 3 and len(model.dataset_meta['classes']) == 3


def test_random_weights_follow_the_seed():
    """seed: torch.manual_seed before building and before init_weights, as a script
    doing both by hand gets; another seed gives other weights."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    cfg = Config.fromfile(DET)
    strip_pretrained(cfg)
    init_default_scope('mmdet')
    torch.manual_seed(3)
    ref = MODELS.build(cfg.model)
    torch.manual_seed(3)
    ref.init_weights()
    _assert_same_weights(build_model(DET, seed=3), ref)
    other = build_model(DET, seed=4)
    assert not torch.equal(
        other.state_dict()['bbox_head.retina_cls.weight'],
        ref.state_dict()['bbox_head.retina_cls.weight'],
    )


def test_a_bare_backbone_config_builds_with_overrides():
    cfg = dict(
        default_scope='mmdet',
        model=dict(
            type='CorePVT',
            arch=dict(embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1]),
            num_cores_max=8,
            init_cfg=dict(type='Pretrained', checkpoint='nowhere.pth'),
        ),
    )
    model = build_model(cfg, overrides=dict(num_cores='4'))
    assert type(model).__name__ == 'CorePVT' and model.num_cores == 4 and not model.training
    assert not hasattr(model, 'dataset_meta')
    assert len(model(torch.zeros(1, 3, 32, 32))) == 4


@pytest.mark.parametrize(
    'overrides,param',
    [
        (dict(num_cores=1000), 'num_cores'),
        (dict(num_cores='huge'), 'num_cores'),
        (dict(boundary='wrap'), 'boundary'),
        (dict(scale=-1), 'scale'),
        (dict(stage_attentions='dense'), 'stage_attentions'),
        (dict(cores=8), 'overrides'),
    ],
)
def test_a_bad_override_is_a_one_line_value_error_naming_it(overrides, param):
    with pytest.raises(ValueError) as err:
        build_model(SEG, overrides=overrides)
    msg = str(err.value)
    assert msg.startswith(f'{param} must') and '\n' not in msg


def test_the_callers_config_is_not_edited():
    cfg = Config.fromfile(SEG)
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint='nowhere.pth')
    before = cfg.pretty_text
    model = build_model(cfg, overrides=dict(boundary='zero'), init_weights=False)
    assert cfg.pretty_text == before
    assert model.cfg.model.backbone.boundary == 'zero'
    assert model.cfg.model.backbone.init_cfg is None  # nothing downloaded


def test_strip_pretrained_drops_only_pretrained_inits():
    cfg = dict(
        type='Detector',
        pretrained='a.pth',
        backbone=dict(type='B', init_cfg=dict(type='Pretrained', checkpoint='b.pth')),
        neck=dict(
            type='N',
            init_cfg=[
                dict(type='Pretrained', checkpoint='c.pth'),
                dict(type='Xavier', layer='Conv2d'),
            ],
        ),
        heads=[dict(type='H', init_cfg=dict(type='Normal', std=0.01))],
    )
    assert sorted(strip_pretrained(cfg)) == ['a.pth', 'b.pth', 'c.pth']
    assert cfg['pretrained'] is None
    assert cfg['backbone']['init_cfg'] is None
    assert cfg['neck']['init_cfg'] == dict(type='Xavier', layer='Conv2d')
    assert cfg['heads'][0]['init_cfg'] == dict(type='Normal', std=0.01)


def test_strip_pretrained_reports_what_it_dropped_and_takes_a_config():
    cfg = Config(
        dict(
            model=dict(
                pretrained='a.pth',
                backbone=dict(init_cfg=dict(type='Pretrained', checkpoint='b.pth')),
            )
        )
    )
    assert sorted(strip_pretrained(cfg)) == ['a.pth', 'b.pth']
    assert cfg.model.pretrained is None and cfg.model.backbone.init_cfg is None
    assert strip_pretrained(cfg) == []


def test_palette_from_config_without_checkpoint():
    from mmseg.datasets import ADE20KDataset

    config = osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py')
    model = build_model(config, init_weights=False)
    assert model.dataset_meta['classes'] == ADE20KDataset.METAINFO['classes']
    assert model.dataset_meta['palette'] == [list(p) for p in ADE20KDataset.METAINFO['palette']]


def test_dataset_meta_from_the_checkpoint(tmp_path):
    model = build_model(SEG, init_weights=False)
    n = model.decode_head.num_classes
    ckpt = tmp_path / 'w.pth'
    classes = [f'thing{i}' for i in range(n)]
    meta = dict(dataset_meta=dict(classes=classes, palette=[[i, i, i] for i in range(n)]))
    torch.save(dict(state_dict=model.state_dict(), meta=meta), ckpt)
    loaded = build_model(SEG, str(ckpt))
    assert loaded.dataset_meta['classes'] == tuple(classes)
    assert loaded.dataset_meta['palette'] == [[i, i, i] for i in range(n)]


class _Payload:
    """A pickled object outside mmengine's checkpoint types."""


def test_checkpoints_go_through_the_safe_loader(tmp_path):
    model = build_model(SEG, init_weights=False)
    ckpt = tmp_path / 'unsafe.pth'
    torch.save(dict(state_dict=model.state_dict(), meta=dict(x=_Payload())), ckpt)
    with pytest.raises(pickle.UnpicklingError, match='_Payload'):
        build_model(SEG, str(ckpt))


def test_bad_inputs_name_the_parameter(tmp_path):
    with pytest.raises(FileNotFoundError, match='checkpoint file not found'):
        build_model(SEG, str(tmp_path / 'missing.pth'))
    with pytest.raises(FileNotFoundError, match='config file not found'):
        build_model(str(tmp_path / 'missing.py'))
    with pytest.raises(ValueError, match='^default_scope must be one of'):
        load_model_config(dict(model=dict(type='X'), default_scope='mmocr'))
    with pytest.raises(TypeError, match='^cfg must be'):
        load_model_config(3)


def test_a_config_file_error_starts_with_its_path(tmp_path):
    path = tmp_path / 'ocr.py'
    path.write_text("default_scope = 'mmocr'\nmodel = dict(type='X')\n")
    with pytest.raises(ValueError, match=f'^{re.escape(str(path))}: default_scope must be one of'):
        load_model_config(str(path))
    path.write_text("default_scope = 'mmdet'\nmodel = 3\n")
    with pytest.raises(ValueError, match=f'^{re.escape(str(path))}: model must be a dict'):
        load_model_config(str(path))
