"""Checkpoints that survive a kill, and ``--resume`` past a broken checkpoint, through
tools/train.py on the toy COCO data (mmdet's RetinaNet, tiny): one run killed, resumed,
its newest checkpoint truncated and resumed again."""

import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import FIXTURE_CONFIGS, REPO, command_state_kept, run_tool
from mmcirc.cli.train import main as main_train

CONFIG = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')
HOOKS_DIR = osp.join(REPO, 'tests', 'fixtures', 'hooks')


def _iter_of(path):
    return torch.load(path, weights_only=False)['meta']['iter']


@pytest.fixture(scope='module')
def killed_then_resumed(toy_root, tmp_path_factory):
    """tools/train.py killed (SIGKILL) while it saves iteration 4's checkpoint, then
    ``--resume`` in the same work dir: (the work dir, what the kill left there, the
    iteration of the resumed run's ``iter_4.pth``, its log)."""
    tmp = tmp_path_factory.mktemp('killed')
    work, marker = tmp / 'work', tmp / 'in_save'
    cfg = tmp / 'slow_save.py'
    cfg.write_text(
        f"_base_ = '{CONFIG}'\n"
        "custom_imports = dict(imports=['mmcirc', 'slow_save_hook'], allow_failed_imports=False)\n"
        f"custom_hooks = [dict(type='SlowSaveHook', at_iter=4, marker='{marker}')]\n"
    )
    env = dict(
        os.environ,
        PYTHONUNBUFFERED='1',
        PYTHONPATH=os.pathsep.join([REPO, HOOKS_DIR, os.environ.get('PYTHONPATH', '')]),
    )
    proc = subprocess.Popen(
        [sys.executable, osp.join(REPO, 'tools', 'train.py'), str(cfg), '--work-dir', str(work)],
        cwd=toy_root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    try:
        assert marker.exists(), (
            f'the save of iteration 4 never reached fsync:\n{proc.stdout.read()[-3000:]}'
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    left = dict(
        iter_4=(work / 'iter_4.pth').exists(),
        last_checkpoint=(work / 'last_checkpoint').read_text().strip(),
        iter_2=_iter_of(work / 'iter_2.pth'),
    )
    proc = run_tool(['tools/train.py', CONFIG, '--work-dir', str(work), '--resume'], cwd=toy_root)
    return work, left, _iter_of(work / 'iter_4.pth'), proc.stdout + proc.stderr


def test_kill_during_a_save_leaves_the_previous_checkpoint(killed_then_resumed):
    work, left, resumed_iter_4, log = killed_then_resumed
    assert not left['iter_4']
    assert left['last_checkpoint'] == str(work / 'iter_2.pth')
    assert left['iter_2'] == 2
    assert 'resumed epoch: 0, iter: 2' in log
    assert resumed_iter_4 == 4


def test_resume_skips_a_truncated_checkpoint(killed_then_resumed, toy_root):
    """The work dir of the killed and resumed run above (iter_2.pth, iter_4.pth), its
    newest checkpoint truncated."""
    work = killed_then_resumed[0]
    latest = work / 'iter_4.pth'
    latest.write_bytes(latest.read_bytes()[:1000])
    proc = run_tool(
        [
            'tools/train.py',
            CONFIG,
            '--work-dir',
            str(work),
            '--resume',
            '--cfg-options',
            'train_cfg.max_iters=6',
            'train_cfg.val_interval=100',
        ],
        cwd=toy_root,
    )
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith('warning: --resume')]
    assert len(warnings) == 1
    assert str(latest) in warnings[0] and str(work / 'iter_2.pth') in warnings[0]
    assert 'resumed epoch: 0, iter: 2' in proc.stdout + proc.stderr
    assert _iter_of(work / 'iter_6.pth') == 6


def test_resume_with_no_intact_checkpoint_is_one_line(tmp_path, run_main):
    work = tmp_path / 'work'
    work.mkdir()
    (work / 'iter_2.pth').write_bytes(os.urandom(512))
    with command_state_kept():
        proc = run_main(main_train, [CONFIG, '--work-dir', str(work), '--resume'], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith('error: --resume: no intact checkpoint')
    assert 'Traceback' not in proc.stderr
