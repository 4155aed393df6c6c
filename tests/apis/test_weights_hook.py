"""mmcirc.apis.weights.WeightsFitHook: what a Runner loads is checked against its model
before anything is scored or trained. The reference: the two state dicts compared key by
key and shape by shape here; the loads are mmengine's own (``load_state_dict``, as its
Runner and ``init_cfg=dict(type='Pretrained')`` call it)."""

import copy
import os.path as osp
import types
import warnings

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import IterBasedTrainLoop
from mmengine.runner.checkpoint import load_state_dict

from helpers import FIXTURE_CONFIGS
from mmcirc.apis import RandomWeightsWarning, WeightsFitHook, WeightsMismatchError, build_model

pytestmark = pytest.mark.usefixtures('one_torch_thread')

SEG = osp.join(FIXTURE_CONFIGS, 'ca_pvt_fpn_tiny.py')  # CA-PVT + Semantic FPN, 5 classes
DET = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')  # ResNet-18 RetinaNet
HEAD = 'decode_head.conv_seg.weight'


@pytest.fixture(scope='module')
def models():
    """The config's model, the same with 3 classes (another dataset) and a detector
    (another model), each with its own random weights."""
    cfg = Config.fromfile(SEG)
    cfg.model.decode_head.num_classes = 3
    return types.SimpleNamespace(
        seg=build_model(SEG, seed=0),
        three=build_model(cfg, seed=1),
        det=build_model(DET, seed=2, init_weights=False),
    )


def _runner(model, max_iters=None):
    loop = None
    if max_iters is not None:  # the Runner's loop, without its data loader
        loop = IterBasedTrainLoop.__new__(IterBasedTrainLoop)
        loop._max_iters = max_iters
    return types.SimpleNamespace(model=model, train_loop=loop)


def _checkpoint(model, **meta):
    return dict(state_dict=dict(model.state_dict()), meta=meta)


def _shaped_otherwise(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sorted(k for k in sa.keys() & sb.keys() if sa[k].shape != sb[k].shape)


def _fresh(models):
    """The config's model with every tensor zero (nothing loaded yet)."""
    model = copy.deepcopy(models.seg)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.zero_()
    return model


def test_testing_refuses_another_class_count_naming_the_keys_and_shapes(models):
    hook = WeightsFitHook('test', 'three.pth')
    with pytest.raises(WeightsMismatchError) as info:
        hook.after_load_checkpoint(_runner(_fresh(models)), _checkpoint(models.three))
    assert sorted(k for k, _, _ in info.value.fit.mismatched) == _shaped_otherwise(
        models.three, models.seg
    )
    shape = tuple(models.three.state_dict()[HEAD].shape)
    message = str(info.value)
    assert '\n' not in message and message.startswith('checkpoint three.pth does not fit')
    assert f'{HEAD}: checkpoint {shape}, model {(5, *shape[1:])}' in message


def test_testing_with_partial_weights_warns_once(models):
    hook = WeightsFitHook('test', 'three.pth', allow_partial=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        hook.after_load_checkpoint(_runner(_fresh(models)), _checkpoint(models.three))
    (warning,) = [w for w in caught if issubclass(w.category, RandomWeightsWarning)]
    assert 'three.pth loaded in part' in str(warning.message) and HEAD in str(warning.message)


def test_testing_a_complete_checkpoint_passes_silently(models):
    model = _fresh(models)
    with warnings.catch_warnings():
        warnings.simplefilter('error', RandomWeightsWarning)
        WeightsFitHook('test', 'w.pth').after_load_checkpoint(
            _runner(model), _checkpoint(models.seg)
        )
    for key, value in models.seg.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_fine_tuning_loads_a_checkpoint_of_other_classes(models):
    model = _fresh(models)
    WeightsFitHook('train', 'three.pth').after_load_checkpoint(
        _runner(model), _checkpoint(models.three)
    )
    key = 'backbone.layers.0.patch_embed.projection.weight'
    assert key in model.state_dict()
    assert torch.equal(model.state_dict()[key], models.three.state_dict()[key])


def test_fine_tuning_refuses_another_models_backbone(models):
    with pytest.raises(WeightsMismatchError) as info:
        WeightsFitHook('train', 'det.pth').after_load_checkpoint(
            _runner(_fresh(models)), _checkpoint(models.det)
        )
    message = str(info.value)
    assert "det.pth does not fit the config's backbone" in message and '\n' not in message
    backbone = [k for k in models.seg.state_dict() if k.startswith('backbone.')]
    assert sorted(info.value.fit.missing) == sorted(backbone)


def test_fine_tuning_refuses_a_backbone_tensor_shaped_otherwise(models):
    state = dict(models.seg.state_dict())
    key = 'backbone.layers.0.patch_embed.projection.weight'
    state[key] = torch.zeros(4, *state[key].shape[1:])
    with pytest.raises(WeightsMismatchError, match=rf'{key}: checkpoint \(4, '):
        WeightsFitHook('train', 'x.pth').after_load_checkpoint(
            _runner(_fresh(models)), dict(state_dict=state)
        )


def test_an_init_cfg_checkpoint_of_another_model_is_refused_before_training(models):
    """What ``init_cfg=dict(type='Pretrained')`` does (mmengine's load into the
    backbone) with a ResNet's backbone tensors, between before_run and before_train."""
    model = _fresh(models)
    hook = WeightsFitHook('train')
    hook.before_run(_runner(model))
    det_backbone = {
        k[len('backbone.') :]: v
        for k, v in models.det.state_dict().items()
        if k.startswith('backbone.')
    }
    load_state_dict(model.backbone, det_backbone)
    with pytest.raises(WeightsMismatchError, match="does not fit the config's backbone"):
        hook.before_train(_runner(model))


def test_an_init_cfg_checkpoint_that_fits_in_part_is_fine_tuning(models):
    """A converted release: the backbone's tensors less the new attention ones."""
    model = _fresh(models)
    hook = WeightsFitHook('train')
    hook.before_run(_runner(model))
    backbone = {
        k[len('backbone.') :]: v
        for k, v in models.seg.state_dict().items()
        if k.startswith('backbone.')
    }
    dropped = [k for k in backbone if '.attn.' in k]
    assert dropped
    load_state_dict(model.backbone, {k: v for k, v in backbone.items() if k not in dropped})
    hook.before_train(_runner(model))


def test_resuming_into_a_changed_model_names_the_first_key(models):
    with pytest.raises(WeightsMismatchError) as info:
        WeightsFitHook('resume', 'iter_4.pth').after_load_checkpoint(
            _runner(_fresh(models), max_iters=8), _checkpoint(models.three, iter=4)
        )
    fit, message = info.value.fit, str(info.value)
    assert sorted(k for k, _, _ in fit.mismatched) == _shaped_otherwise(models.three, models.seg)
    assert f'{fit.mismatched[0][0]}: checkpoint ' in message and '\n' not in message
    assert 'changed since the checkpoint was saved' in message


def test_resuming_with_nothing_left_to_train_is_refused(models):
    with pytest.raises(ValueError) as info:
        WeightsFitHook('resume', 'iter_4.pth').after_load_checkpoint(
            _runner(_fresh(models), max_iters=4), _checkpoint(models.seg, iter=4)
        )
    assert str(info.value) == (
        'nothing left to train: checkpoint iter_4.pth is at iteration 4 and '
        'train_cfg.max_iters is 4; raise train_cfg.max_iters to train on'
    )


def test_resuming_with_iterations_left_passes(models):
    WeightsFitHook('resume', 'iter_4.pth').after_load_checkpoint(
        _runner(_fresh(models), max_iters=5), _checkpoint(models.seg, iter=4)
    )


def test_testing_through_a_test_time_augmentation_wrapper_is_checked_too(models):
    """``--tta``: the Runner's model is mmseg's SegTTAModel around the config's; the
    checkpoint loads into the inner model (mmengine unwraps it) and is checked there."""
    from mmseg.models import SegTTAModel

    wrapped = SegTTAModel(module=_fresh(models))
    with pytest.raises(WeightsMismatchError, match=HEAD):
        WeightsFitHook('test', 'three.pth').after_load_checkpoint(
            _runner(wrapped), _checkpoint(models.three)
        )
