"""Sharded training on a data x space mesh (SpatialParallel(shard_size=S)) of 4 gloo ranks,
S = 1 (plain data parallel), 2 (two data groups of two spatial ranks) and 4 (one
spatial group), against mmengine's own one-process ``train_step`` on the global batch of
four images: a tiny CA-PVT (circulant and core stages) with Semantic FPN and an auxiliary
FCN head (BatchNorm heads: their statistics over the global batch), a pyramid pooling
head (BatchNorm on pooled maps every spatial rank holds), pixels ignored, float64, the
image's rows divisible by neither 2 nor 4. Each data group takes its own images; the
logged losses and accuracy, every parameter's gradient at the optimizer step and the
BatchNorm running statistics after it equal one process's within 1e-9 relative; every
rank ends with the same parameters. A shard size that does not divide the world is one
line before anything runs.

The models are built here; one run_parallel call (a fork server: the ranks run
backward, which this process has done) runs the three shard sizes in turn."""

import copy
import os.path as osp

import pytest
import torch

from helpers import REPO, CastInputs, seg_batch, sgd_step_record
from mmcirc.distributed import run_parallel

TRAIN = """_base_ = {base!r}
model = dict(
    data_preprocessor=dict(size={size}),
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 2]), init_cfg=None, drop_path_rate=0.0,
                  stage_attentions=('circulant', 'core', 'circulant', 'core')),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8, num_classes=5, dropout_ratio=0.0),
    auxiliary_head=[
        dict(type='FCNHead', in_channels=8, in_index=2, channels=8, num_convs=1,
             num_classes=5, dropout_ratio=0.0, norm_cfg=dict(type='SyncBN', requires_grad=True),
             loss_decode=dict(type='CrossEntropyLoss', loss_weight=0.4)),
        dict(type='PSPHead', in_channels=8, in_index=3, channels=8, pool_scales=(1, 2),
             num_classes=5, dropout_ratio=0.0, norm_cfg=dict(type='SyncBN', requires_grad=True),
             loss_decode=dict(type='CrossEntropyLoss', loss_weight=0.2))])
"""
SIZE = (99, 60)  # 4 rows in stage 4: one for each of 4 spatial ranks
WORLD, IMAGES = 4, 4
SHARD_SIZES = (1, 2, 4)
TOL = 1e-9


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    """(the model, its one-process step on the four images: log, gradients, state)."""
    from mmengine.model import revert_sync_batchnorm

    from mmcirc.apis.builder import build_model

    path = tmp_path_factory.mktemp('mesh') / 'tiny_mesh.py'
    base = osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py')
    path.write_text(TRAIN.format(base=base, size=SIZE))
    model = revert_sync_batchnorm(build_model(str(path), seed=0)).double()
    model.data_preprocessor.forward = CastInputs(model.data_preprocessor, torch.float64)
    model.train()
    ref_model = copy.deepcopy(model)
    batch = seg_batch(IMAGES, SIZE, num_classes=5, ignored=0.2)
    return model, sgd_step_record(ref_model, ref_model.train_step, batch)


def _worker(model):
    """Per shard size S: this rank's data group's images (group d of 4 / S: images
    [d S, (d + 1) S)) stepped by the wrapper; and the refusal of S = 3."""
    from mmcirc.distributed.comm import data_rank
    from mmcirc.distributed.segmentor.train import SpatialParallel

    batch = seg_batch(IMAGES, SIZE, num_classes=5, ignored=0.2)
    out = {}
    for size in SHARD_SIZES:
        d, groups = data_rank(size)
        per = IMAGES // groups
        mine = {k: v[d * per : (d + 1) * per] for k, v in batch.items()}
        wrapped = SpatialParallel(copy.deepcopy(model), shard_size=size)
        out[size] = sgd_step_record(wrapped.module, wrapped.train_step, mine)
    try:
        SpatialParallel(copy.deepcopy(model), shard_size=3)
    except ValueError as err:
        out['refused'] = str(err)
    return out


@pytest.fixture(scope='module')
def mesh(setup):
    torch.set_num_threads(1)
    return run_parallel(_worker, WORLD, args=(setup[0],), start_method='forkserver')


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize('size', SHARD_SIZES)
def test_step_equals_one_process_on_the_global_batch(setup, mesh, size):
    _, (ref_log, ref_grads, ref_after) = setup
    log, grads, after = mesh[0][size]
    assert log.keys() == ref_log.keys() and 'aux_0.acc_seg' in log
    for k, v in ref_log.items():
        assert abs(log[k] - v) <= TOL * abs(v), f'S={size} {k}: {log[k]} vs {v}'
    assert grads.keys() == ref_grads.keys() and len(grads) > 20
    bad = {n: _rel(grads[n], g) for n, g in ref_grads.items() if _rel(grads[n], g) > TOL}
    assert not bad, f'S={size}: gradients off {bad}'
    stats = [k for k in ref_after if 'running_' in k]
    assert any('psp_modules' in k for k in stats)  # BatchNorm on the pooled maps
    bad = {k: _rel(after[k], ref_after[k]) for k in stats if _rel(after[k], ref_after[k]) > TOL}
    assert not bad, f'S={size}: BatchNorm statistics off {bad}'
    for r in range(1, WORLD):  # every rank took the same step
        assert all(torch.equal(v, mesh[r][size][2][k]) for k, v in after.items())


def test_shard_size_not_dividing_the_world_is_refused_in_one_line(setup, mesh):
    assert all(
        m['refused'] == 'shard_size must divide the world size 4 (one of (1, 2, 4)), got 3'
        for m in mesh
    )
    from mmcirc.distributed.segmentor.train import SpatialParallel

    with pytest.raises(ValueError, match=r'^shard_size must divide the world size 1 \(one of'):
        SpatialParallel(setup[0], shard_size=2)  # one process: a world of one rank
