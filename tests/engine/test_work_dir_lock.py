"""mmcirc.engine.work_dir_lock: one training run per work dir. The holders are real
processes (the lock module alone, loaded by path: no torch import), killed with SIGKILL
where a run dies; a torchrun restart (``--max-restarts``) on loopback."""

import json
import os
import os.path as osp
import signal
import socket
import subprocess
import sys

import pytest

from helpers import REPO
from mmcirc.engine import WorkDirBusyError, WorkDirLock, launcher_rank
from mmcirc.engine.work_dir_lock import LOCK_NAME

MODULE = osp.join(REPO, 'mmcirc', 'engine', 'work_dir_lock.py')

#: Python that loads the lock module by path as ``lock_module``.
PRELUDE = f"""
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location('lock_module', {MODULE!r})
lock_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock_module)
"""


def _holder(work, then='hold'):
    """A process that takes the lock of ``work``, says so on stdout, then holds it
    (``'hold'``) or exits normally (``'exit'``)."""
    code = PRELUDE + (
        f'lock_module.WorkDirLock({str(work)!r}).acquire()\n'
        "print('locked', flush=True)\n"
        + ('import time; time.sleep(120)\n' if then == 'hold' else '')
    )
    proc = subprocess.Popen(
        [sys.executable, '-c', code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout.readline().strip() == 'locked'
    return proc


def test_a_second_run_is_refused_naming_the_first(tmp_path):
    first = _holder(tmp_path)
    try:
        with pytest.raises(WorkDirBusyError) as info:
            WorkDirLock(str(tmp_path)).acquire()
    finally:
        first.kill()
        first.wait()
        first.stdout.close()
    message = str(info.value)
    assert f'pid {first.pid} on {socket.gethostname()}' in message and '\n' not in message
    assert message.startswith(f'work dir {tmp_path} is in use by another training run')
    assert info.value.holder['pid'] == first.pid


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path):
    first = _holder(tmp_path)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    first.stdout.close()
    lock = WorkDirLock(str(tmp_path)).acquire()
    try:
        assert lock.previous['pid'] == first.pid
        record = json.loads((tmp_path / LOCK_NAME).read_text())
        assert record['pid'] == os.getpid() and record['host'] == socket.gethostname()
    finally:
        lock.release()


def test_the_lock_is_released_when_the_run_ends(tmp_path):
    first = _holder(tmp_path, then='exit')
    assert first.wait(timeout=60) == 0
    first.stdout.close()
    assert not (tmp_path / LOCK_NAME).exists()
    with WorkDirLock(str(tmp_path)) as lock:
        assert lock.previous is None and (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.parametrize(
    'launcher,env,rank',
    [
        ('none', {'RANK': '3'}, 0),
        ('pytorch', {'RANK': '3'}, 3),
        ('slurm', {'SLURM_PROCID': '2'}, 2),
    ],
)
def test_the_global_rank_comes_from_the_launchers_variable(monkeypatch, launcher, env, rank):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert launcher_rank(launcher) == rank


#: A torchrun worker: rank 0 takes the lock; in the first attempt it records its pid and
#: kills itself (SIGKILL: a crash), after the restart it reports whom it took over from.
WORKER = (
    PRELUDE
    + """
import json, signal
work = sys.argv[1]
if int(os.environ['RANK']) != 0:
    sys.exit(0)
lock = lock_module.WorkDirLock(work).acquire()
if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':
    with open(os.path.join(work, 'first_pid'), 'w') as f:
        f.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)
print(json.dumps(dict(previous=lock.previous['pid'], pid=os.getpid())), flush=True)
"""
)


def test_a_torchrun_restart_takes_over_its_killed_rank_0(tmp_path):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    work = tmp_path / 'work'
    proc = subprocess.run(
        [
            sys.executable, '-m', 'torch.distributed.run', '--nnodes', '1',
            '--nproc-per-node', '2', '--max-restarts', '1', '--master-addr', '127.0.0.1',
            '--master-port', '34571', str(script), str(work),
        ],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS='1'),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
    report = json.loads(line)
    assert report['previous'] == int((work / 'first_pid').read_text())
    assert report['pid'] != report['previous']
    assert not (work / LOCK_NAME).exists()
