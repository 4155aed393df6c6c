"""tools/train.py --shard under torchrun (2 gloo ranks) against the same command in one
process (its main, in the test process): a tiny CA-PVT FPN on the toy ADE20K shapes
(random crops, flips and resizes drawn by two data workers per rank): every logged loss
and the validation mIoU equal one process's, rank 0 alone writes the checkpoint, and
``--resume`` continues from it. ``--shard-size 1`` (two data groups of one rank, a fixed
resize: no random draws) against one process on the global batch of both groups'
images. Bad use is one ``error:`` line."""

import json
import os
import os.path as osp
import subprocess
import sys

import pytest

from helpers import REPO, command_state_kept

CONFIG = """_base_ = {base!r}
data_root = {root!r}
crop_size = (64, 64)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 2]), drop_path_rate=0.0),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8, dropout_ratio=0.0))
# no random draws in the model: the resumed run's steps equal the uninterrupted one's
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(64, 64), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 64), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size=2, num_workers=2,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=4, val_interval=4)
param_scheduler = [dict(type='PolyLR', power=1.0, eta_min=1e-5, by_epoch=False, begin=0, end=4)]
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=2), logger=dict(interval=1))
"""


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    from mmcirc.datasets.toy_data import make_toy_ade

    tmp = tmp_path_factory.mktemp('shard_train')
    root = make_toy_ade(tmp / 'data', num_train=8, num_val=3, img_size=(64, 80))['root']
    cfg = tmp / 'tiny_toy.py'
    base = osp.join(REPO, 'configs', 'toy', 'ca_pvt_t_fpn_toy_ade.py')
    cfg.write_text(CONFIG.format(base=base, root=str(root)))
    return str(cfg), tmp


def _scalars(work):
    (run,) = [d for d in os.listdir(work) if osp.isdir(osp.join(work, d, 'vis_data'))]
    with open(osp.join(work, run, 'vis_data', 'scalars.json')) as f:
        rows = [json.loads(line) for line in f]
    losses = {r['step']: r['loss'] for r in rows if 'loss' in r}
    miou = [r['mIoU'] for r in rows if 'mIoU' in r]
    return losses, miou


def _torchrun(setup, work, *extra, check=True):
    from mmcirc.distributed import free_port

    cfg, tmp = setup
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc-per-node', '2',
           '--master-port', str(free_port()), osp.join(REPO, 'tools', 'train.py'), cfg,
           '--launcher', 'pytorch', '--shard', '--work-dir', str(tmp / work), *extra]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert (proc.returncode == 0) == check, proc.stderr[-6000:]
    return proc


def _one_process(args, cwd):
    """tools/train.py's main with ``args`` in this process (one process, no launcher):
    its exit code (``main_guard``'s exit 1 for an error line)."""
    from mmcirc.cli.train import main

    with command_state_kept(cwd):
        try:
            main(args)
        except SystemExit as exit_:
            return exit_.code
    return 0


@pytest.fixture(scope='module')
def runs(setup):
    cfg, tmp = setup
    assert _one_process([cfg, '--work-dir', str(tmp / 'one')], tmp) == 0
    _torchrun(setup, 'sharded', '--cfg-options', 'train_cfg.max_iters=2')
    _torchrun(setup, 'sharded', '--resume')
    return _scalars(tmp / 'one'), tmp


def test_sharded_losses_and_miou_equal_one_process_and_resume_continues(runs):
    (one, one_miou), tmp = runs
    work = tmp / 'sharded'
    assert sorted(one) == [1, 2, 3, 4]
    logged = {}
    for d in sorted(os.listdir(work)):  # the first run (steps 1-2), the resumed (3-4)
        if osp.isdir(work / d / 'vis_data'):
            with open(work / d / 'vis_data' / 'scalars.json') as f:
                for r in map(json.loads, f):
                    if 'loss' in r:
                        logged[r['step']] = r['loss']
                    if 'mIoU' in r:
                        miou = r['mIoU']
    assert sorted(logged) == [1, 2, 3, 4]
    for step, loss in one.items():
        assert abs(logged[step] - loss) <= 1e-4, f'step {step}: {logged[step]} vs {loss}'
    assert abs(miou - one_miou[-1]) < 0.1
    assert sorted(p for p in os.listdir(work) if p.endswith('.pth')) == ['iter_2.pth', 'iter_4.pth']


def test_shard_without_a_distributed_launch_is_one_error_line(setup, capsys):
    cfg, tmp = setup
    assert _one_process([cfg, '--shard', '--work-dir', str(tmp / 'x')], tmp) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        'error: --shard needs a distributed launch: torchrun --nproc-per-node P '
        'tools/train.py CONFIG --launcher pytorch --shard'
    )


MESH = """_base_ = {base!r}
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='Resize', scale=(64, 64), keep_ratio=False),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size={batch}, dataset=dict(pipeline=train_pipeline))
train_cfg = dict(max_iters=2, val_interval=2)
param_scheduler = [dict(type='PolyLR', power=1.0, eta_min=1e-5, by_epoch=False, begin=0, end=2)]
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=2), logger=dict(interval=1))
"""


def test_data_groups_of_one_rank_step_as_one_process_on_the_global_batch(setup):
    """2 ranks as 2 x 1: each reads its own image (batch 1 per group), the step and the
    validation mIoU (the val images spread over both ranks) equal one process's with
    batch 2; S = 3 is one error line on each rank."""
    cfg, tmp = setup
    for batch in (1, 2):
        (tmp / f'mesh{batch}.py').write_text(MESH.format(base=cfg, batch=batch))
    assert _one_process([str(tmp / 'mesh2.py'), '--work-dir', str(tmp / 'mesh_one')], tmp) == 0
    _torchrun((str(tmp / 'mesh1.py'), tmp), 'mesh', '--shard-size', '1')
    (one, one_miou), (two, two_miou) = _scalars(tmp / 'mesh_one'), _scalars(tmp / 'mesh')
    assert sorted(one) == sorted(two) == [1, 2]
    for step, loss in one.items():
        assert abs(two[step] - loss) <= 1e-4, f'step {step}: {two[step]} vs {loss}'
    assert abs(two_miou[-1] - one_miou[-1]) < 0.1
    proc = _torchrun((str(tmp / 'mesh1.py'), tmp), 'mesh3', '--shard-size', '3', check=False)
    errors = {line for line in proc.stderr.splitlines() if line.startswith('error:')}
    assert errors == {'error: shard_size must divide the world size 2 (one of (1, 2)), got 3'}
