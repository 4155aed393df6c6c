"""Spatially sharded training (mmcirc.distributed.segmentor.train) on 2 and 3 gloo ranks
against mmengine's own one-process ``train_step`` on the whole batch: tiny CA-PVT (all
circulant) and Core-PVT (all core) with Semantic FPN (BatchNorm heads, an auxiliary
head, pixels ignored, the rate-0.1 stochastic depth and channel dropout drawn), float64,
a batch of two images whose rows divide by neither 2 nor 3. The logged losses and
accuracy, every parameter's gradient at the optimizer step and the BatchNorm running
statistics after it equal one process's within 1e-9 relative; every rank ends with the
same parameters. Refusals before the first step: one line naming module and op.

The models are built here; one run_parallel call per world size sends them to its ranks
(started by a fork server: the ranks run backward, which this process has done)."""

import copy
import os.path as osp

import pytest
import torch

from helpers import FIXTURE_CONFIGS, REPO, CastInputs, seg_batch, sgd_step_record
from mmcirc.distributed import run_parallel

TRAIN = """_base_ = {base!r}
model = dict(
    data_preprocessor=dict(size={size}),
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 2]), init_cfg=None),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8, num_classes=5{loss}){aux})
"""
AUX = """,
    auxiliary_head=dict(type='FCNHead', in_channels=8, in_index=2, channels=8, num_convs=1,
                        num_classes=5, norm_cfg=dict(type='SyncBN', requires_grad=True),
                        loss_decode=dict(type='CrossEntropyLoss', loss_weight=0.4))"""
NON_IGNORE = ", loss_decode=dict(type='CrossEntropyLoss', loss_weight=1.0, avg_non_ignore=True)"
SIZE = (70, 100)
CASES = {
    'ca_pvt_allcirc_fpn': ('ca_pvt_t-allcirc_fpn_80k_ade20k.py', '', ''),
    'core_pvt_allcore_fpn_aux': ('core_pvt_t-allcore_fpn_80k_ade20k.py', NON_IGNORE, AUX),
}
TOL = 1e-9


def _build(tmp, name, **fmt):
    from mmengine.model import revert_sync_batchnorm

    from mmcirc.apis.builder import build_model

    base, loss, aux = CASES[name]
    path = tmp / f'{name}.py'
    text = dict(base=osp.join(REPO, 'configs', base), size=SIZE, loss=loss, aux=aux)
    path.write_text(TRAIN.format(**dict(text, **fmt)))
    model = revert_sync_batchnorm(build_model(str(path), seed=0)).double()
    model.data_preprocessor.forward = CastInputs(model.data_preprocessor, torch.float64)
    return model.train()


def _step(model, train_step):
    """One SGD step of mmseg's train_step on two images of SIZE (5 classes, 20 % of the
    pixels ignored): (log values, gradients at the step, state after it)."""
    return sgd_step_record(model, train_step, seg_batch(2, SIZE, num_classes=5, ignored=0.2))


@pytest.fixture(scope='module')
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('train_models')
    out = {}
    for name in CASES:
        model = _build(tmp, name)
        ref_model = copy.deepcopy(model)
        ref = _step(ref_model, ref_model.train_step)  # mmengine's one-process step
        out[name] = (model, ref)
    return out


def _worker(models):
    from mmcirc.distributed.segmentor.train import SpatialParallel

    out = {}
    for name, (model, _) in models.items():
        wrapped = SpatialParallel(model)
        out[name] = _step(wrapped.module, wrapped.train_step)
    return out


@pytest.fixture(scope='module', params=[2, 3])
def sharded(request, models):
    torch.set_num_threads(1)
    return run_parallel(_worker, request.param, args=(models,), start_method='forkserver')


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize('name', list(CASES))
def test_loss_gradients_and_statistics_equal_one_process(models, sharded, name):
    _, (ref_log, ref_grads, ref_after) = models[name]
    log, grads, after = sharded[0][name]
    assert log.keys() == ref_log.keys()
    for k, v in ref_log.items():
        assert abs(log[k] - v) <= TOL * abs(v), f'{name} {k}: {log[k]} vs {v}'
    assert grads.keys() == ref_grads.keys() and len(grads) > 20
    bad = {n: _rel(grads[n], g) for n, g in ref_grads.items() if _rel(grads[n], g) > TOL}
    assert not bad, f'{name}: gradients off {bad}'
    stats = [k for k in ref_after if 'running_' in k]
    assert stats and all(_rel(after[k], ref_after[k]) < TOL for k in stats)
    for r in range(1, len(sharded)):  # every rank took the same step
        assert all(torch.equal(v, sharded[r][name][2][k]) for k, v in after.items())


def _refused(model, match):
    from mmcirc.distributed.segmentor.train import SpatialParallel

    with pytest.raises(ValueError, match=match) as err:
        SpatialParallel(model)
    assert '\n' not in str(err.value)


def test_cascade_segmentor_refused(tmp_path):
    from mmseg.models.segmentors import CascadeEncoderDecoder

    model = _build(tmp_path, 'ca_pvt_allcirc_fpn')
    model.__class__ = CascadeEncoderDecoder  # its loss refines the heads' outputs in turn
    _refused(
        model, r"^segmentor CascadeEncoderDecoder: sharded training: mmseg's EncoderDecoder only"
    )


def test_swin_windows_refused():
    from mmcirc.apis.builder import build_model

    model = build_model(osp.join(FIXTURE_CONFIGS, 'ca_swin_upernet_tiny.py'))
    _refused(model, r"shifted-window attention \('window'\)")


def test_dice_loss_refused(tmp_path):
    loss = ", loss_decode=dict(type='DiceLoss')"
    _refused(
        _build(tmp_path, 'ca_pvt_allcirc_fpn', loss=loss),
        r'^decode_head.loss_decode DiceLoss: sharded training: the whole-image loss is summed',
    )


def test_elementwise_dropout_refused_naming_module_and_op(tmp_path):
    model = _build(tmp_path, 'ca_pvt_allcirc_fpn')
    model.neck.lateral_convs[0].conv.register_forward_hook(
        lambda m, a, out: torch.nn.functional.dropout(out, 0.1, True)
    )
    _refused(
        model,
        r'^neck\.lateral_convs\.0\.conv: sharded training: F\.dropout \(p=0\.1\) draws '
        'its mask per band',
    )


def test_check_leaves_model_and_random_state_as_they_were(tmp_path):
    from mmcirc.distributed.segmentor.train import check_trainable

    model = _build(tmp_path, 'core_pvt_allcore_fpn_aux')
    before = copy.deepcopy(model.state_dict())
    torch.manual_seed(5)
    state = torch.random.get_rng_state()
    check_trainable(model)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())
