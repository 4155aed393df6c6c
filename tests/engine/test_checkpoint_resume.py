"""SafeCheckpointIOHook writes a Runner checkpoint that torch's ``weights_only`` loader
reads, and ``--resume`` from it restores the message hub, the optimizer and the
schedulers exactly: as an uninterrupted run of mmengine's Runner had them (a toy model,
AdamW, warm-up then cosine, four iterations)."""

import copy
import uuid

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

pytestmark = pytest.mark.usefixtures('mmengine_own_io')  # put back after each test


class _Model(BaseModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.linear(torch.stack(inputs))
        if mode == 'loss':
            return dict(loss=((out.squeeze(1) - torch.stack(data_samples)) ** 2).mean())
        return out


class _Data(Dataset):
    metainfo = dict(classes=('a', 'b'))
    x = torch.linspace(-1, 1, 24).view(8, 3)
    y = torch.linspace(0, 2, 8)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return dict(inputs=self.x[i], data_samples=self.y[i])


class _Snapshot(Hook):
    """Copies the Runner's hub, optimizer and scheduler states after iteration ``at``,
    once the checkpoint hook has run (lowest priority)."""

    priority = 'LOWEST'

    def __init__(self, at, into):
        self.at, self.into = at, into

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.at:  # runner.iter counts from 0 until the hooks ran
            self.into.update(_states(runner))


def _states(runner):
    """Copies: an optimizer's state_dict holds the live tensors."""
    return copy.deepcopy(
        dict(
            hub=runner.message_hub.state_dict(),
            optimizer=runner.optim_wrapper.state_dict(),
            schedulers=[s.state_dict() for s in runner.param_schedulers],
        )
    )


def _runner(work_dir, max_iters, snapshot=None, resume_from=None, hook=True):
    default_hooks = dict(
        checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=2),
        logger=dict(type='LoggerHook', interval=1),
    )
    if hook:
        default_hooks['safe_checkpoint_io'] = dict(type='SafeCheckpointIOHook')
    return Runner(
        model=_Model(),
        work_dir=str(work_dir),
        experiment_name=f'resume-{uuid.uuid4().hex}',  # a message hub of its own
        train_dataloader=dict(
            dataset=_Data(),
            sampler=dict(type='DefaultSampler', shuffle=False),
            batch_size=2,
            num_workers=0,
        ),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01, weight_decay=0.05)),
        param_scheduler=[
            dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2),
            dict(type='CosineAnnealingLR', by_epoch=False, begin=2, end=4, eta_min=1e-4),
        ],
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=default_hooks,
        custom_hooks=[_Snapshot(*snapshot)] if snapshot else None,
        load_from=resume_from,
        resume=resume_from is not None,
        log_level='WARNING',
        default_scope='mmengine',
    )


def _same(a, b, skip=()):
    """Equal values of the same types (tensors: dtype and values; numpy: dtype, shape
    and values), all the way down; dict keys in ``skip`` are not compared."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, HistoryBuffer):
        assert a.max_length == b.max_length
        for x, y in zip(a.data, b.data):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert sorted(a, key=str) == sorted(b, key=str)
        for k in a:
            if k not in skip:
                _same(a[k], b[k], skip)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y, skip)
    else:
        assert a == b, (a, b)


@pytest.fixture
def uninterrupted(tmp_path):
    """Four iterations in one go: the states after iterations 2 and 4, and the work_dir."""
    at2, at4 = {}, {}
    runner = _runner(tmp_path / 'a', 4, snapshot=(2, at2))
    runner.register_hook(_Snapshot(4, at4))
    runner.train()
    return at2, at4, tmp_path / 'a'


def test_the_checkpoint_holds_only_what_weights_only_loading_reads(uninterrupted):
    ckpt = torch.load(uninterrupted[2] / 'iter_2.pth', weights_only=True)
    assert ckpt['meta']['iter'] == 2 and 'train/loss' in ckpt['message_hub']['log_scalars']


def test_resume_restores_the_states_the_run_saved(uninterrupted, tmp_path):
    at2, _, work = uninterrupted
    runner = _runner(tmp_path / 'b', 4)
    # built before resuming, as Runner.train does (a scheduler built later moves the lr)
    runner.optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.param_schedulers = runner.build_param_scheduler(runner.param_schedulers)
    runner.resume(str(work / 'iter_2.pth'))
    _same(_states(runner), at2)
    assert isinstance(runner.message_hub.get_scalar('train/loss'), HistoryBuffer)


def test_a_resumed_run_ends_as_the_uninterrupted_one(uninterrupted, tmp_path):
    _, at4, work = uninterrupted
    resumed = {}
    _runner(tmp_path / 'b', 4, snapshot=(4, resumed), resume_from=str(work / 'iter_2.pth')).train()
    # the time it took and the work_dir differ from run to run; every other value is the same
    _same(resumed, at4, skip={'train/time', 'train/data_time', 'last_ckpt'})


def test_a_checkpoint_of_stock_mmengine_still_resumes_through_the_hook(tmp_path):
    """Written without the hook (mmengine's own pickled HistoryBuffers, as stock mmdet
    and mmseg write them), resumed with it: the run ends as the uninterrupted one."""
    at4, resumed = {}, {}
    runner = _runner(tmp_path / 'a', 4, snapshot=(4, at4), hook=False)
    runner.train()
    ckpt = str(tmp_path / 'a' / 'iter_2.pth')
    _runner(tmp_path / 'b', 4, snapshot=(4, resumed), resume_from=ckpt).train()
    _same(resumed, at4, skip={'train/time', 'train/data_time', 'last_ckpt'})
