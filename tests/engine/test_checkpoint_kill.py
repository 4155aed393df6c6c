"""A save killed (SIGKILL) between writing the checkpoint's temporary file and renaming
it leaves that file behind; the next training start in the same work_dir, resumed or
not, removes it, and the folder then holds only complete checkpoints."""

import os
import os.path as osp
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import REPO

HOOKS_DIR = osp.join(REPO, 'tests', 'fixtures', 'hooks')

# mmengine's Runner on a toy model with the hook every mmcirc config names; argv: work_dir,
# resume (0/1), the iteration whose save stalls (0: none), the marker file of the stall.
TRAIN = r"""
import sys
import torch
from torch import nn
from mmengine.model import BaseModel
from mmengine.runner import Runner
import mmcirc.engine  # SafeCheckpointIOHook
import slow_save_hook  # SlowSaveHook (tests/fixtures/hooks)

work_dir, resume, stall_at, marker = sys.argv[1], sys.argv[2] == '1', int(sys.argv[3]), sys.argv[4]


class Model(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return dict(loss=self.linear(torch.stack(inputs)).pow(2).mean())


data = [dict(inputs=torch.full((64,), i / 8)) for i in range(8)]
Runner(
    model=Model(),
    work_dir=work_dir,
    train_dataloader=dict(dataset=data, sampler=dict(type='DefaultSampler', shuffle=False),
                          batch_size=2, num_workers=0),
    optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
    train_cfg=dict(by_epoch=False, max_iters=6),
    default_hooks=dict(
        checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=2, max_keep_ckpts=2),
        safe_checkpoint_io=dict(type='SafeCheckpointIOHook'),
    ),
    custom_hooks=[dict(type='SlowSaveHook', at_iter=stall_at, marker=marker)] if stall_at else None,
    resume=resume,
    log_level='WARNING',
    default_scope='mmengine',
).train()
"""

TEMPORARY = re.compile(r'^\..*\.tmp$')


def _train(work, resume, stall_at, marker):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join([REPO, HOOKS_DIR]))
    args = [sys.executable, '-c', TRAIN, str(work), str(int(resume)), str(stall_at), str(marker)]
    return subprocess.Popen(
        args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _kill_during_the_save_of_iter_4(work, marker):
    proc = _train(work, resume=False, stall_at=4, marker=marker)
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    try:
        assert marker.exists(), f'the save of iteration 4 never stalled:\n{proc.stdout.read()}'
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


@pytest.fixture(scope='module')
def killed(tmp_path_factory):
    """The work dir of a run killed in the save of iteration 4 (kept as it was left)."""
    tmp = tmp_path_factory.mktemp('killed')
    _kill_during_the_save_of_iter_4(tmp / 'work', tmp / 'in_save')
    return tmp / 'work'


@pytest.mark.parametrize('resume', [True, False], ids=['resume', 'from-scratch'])
def test_the_next_start_removes_what_a_killed_save_left(killed, tmp_path, resume):
    work = tmp_path / 'work'
    shutil.copytree(killed, work)  # each start on its own copy of what the kill left
    assert (work / 'last_checkpoint').read_text().strip() == str(killed / 'iter_2.pth')
    (work / 'last_checkpoint').write_text(str(work / 'iter_2.pth'))  # as written there
    left = [n for n in os.listdir(work) if TEMPORARY.match(n)]
    assert [n for n in left if n.startswith('.iter_4.pth.')], sorted(os.listdir(work))

    proc = _train(work, resume=resume, stall_at=0, marker=tmp_path / 'unused')
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]

    names = sorted(os.listdir(work))
    assert not [n for n in names if TEMPORARY.match(n)], names
    checkpoints = [n for n in names if n.endswith('.pth')]
    assert checkpoints == ['iter_4.pth', 'iter_6.pth'], names  # max_keep_ckpts=2
    for name in checkpoints:  # complete: each loads, and holds its own iteration
        meta = torch.load(work / name, weights_only=True)['meta']
        assert meta['iter'] == int(name[5:-4])
    assert (work / 'last_checkpoint').read_text().strip() == str(work / 'iter_6.pth')
