"""Checkpoints that survive a kill, and ``--resume`` past a broken checkpoint, through
tools/train.py on the toy COCO data (mmdet's RetinaNet, tiny)."""

import os
import os.path as osp
import signal
import subprocess
import sys
import time

import torch

from helpers import FIXTURE_CONFIGS, REPO, run_tool

CONFIG = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')
HOOKS_DIR = osp.join(REPO, 'tests', 'fixtures', 'hooks')


def _iter_of(path):
    return torch.load(path, weights_only=False)['meta']['iter']


def test_kill_during_a_save_leaves_the_previous_checkpoint(toy_root, tmp_path):
    work, marker = tmp_path / 'work', tmp_path / 'in_save'
    cfg = tmp_path / 'slow_save.py'
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
    assert not (work / 'iter_4.pth').exists()
    assert (work / 'last_checkpoint').read_text().strip() == str(work / 'iter_2.pth')
    assert _iter_of(work / 'iter_2.pth') == 2

    proc = run_tool(['tools/train.py', CONFIG, '--work-dir', str(work), '--resume'], cwd=toy_root)
    assert 'resumed epoch: 0, iter: 2' in proc.stdout + proc.stderr
    assert _iter_of(work / 'iter_4.pth') == 4


def test_resume_skips_a_truncated_checkpoint(toy_root, tmp_path):
    work = tmp_path / 'work'
    run_tool(
        [
            'tools/train.py',
            CONFIG,
            '--work-dir',
            str(work),
            '--cfg-options',
            'train_cfg.val_interval=100',
        ],
        cwd=toy_root,
    )
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


def test_resume_with_no_intact_checkpoint_is_one_line(toy_root, tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    (work / 'iter_2.pth').write_bytes(os.urandom(512))
    proc = run_tool(
        ['tools/train.py', CONFIG, '--work-dir', str(work), '--resume'], cwd=toy_root, check=False
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith('error: --resume: no intact checkpoint')
    assert 'Traceback' not in proc.stderr
