"""One training run per work dir: :class:`WorkDirLock`.

Two runs that write one work dir overwrite each other's checkpoints, config copy and
``last_checkpoint``. A run holds ``WORK_DIR/train.lock`` while it trains: an exclusive
``flock`` on that file, which the system drops when the process ends however it ends
(``kill -9`` included), and in the file the holder's pid, host and start, for the line a
second run gets. So a lock whose process is gone is taken over: its flock is free. (On a
file system without ``flock`` the lock is the file alone: taken over when the pid it
names no longer runs on this host.) Only the global rank 0 of a distributed job takes
the lock (:func:`launcher_rank`); a torchrun restart's new rank 0 takes over from its
killed predecessor. The lock is released, and its file removed, when the run ends.
"""

import atexit
import errno
import json
import os
import os.path as osp
import socket
import sys
import time
from typing import Optional

__all__ = ['LOCK_NAME', 'WorkDirBusyError', 'WorkDirLock', 'launcher_rank']

#: The lock file's name inside the work dir.
LOCK_NAME = 'train.lock'

#: The environment variable that holds a process's global rank, per launcher.
_RANK_VARS = dict(pytorch='RANK', slurm='SLURM_PROCID', mpi='OMPI_COMM_WORLD_RANK')

#: How long a lock whose named process is gone may stay held (by that process's forked
#: children, e.g. data-loader workers, which notice their parent's end within seconds).
ORPHAN_GRACE_S = 15.0


class WorkDirBusyError(RuntimeError):
    """The work dir is held by another run: ``holder`` is what its lock file says."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def launcher_rank(launcher: str = 'none') -> int:
    """This process's global rank as ``launcher`` sets it in the environment (torchrun:
    ``RANK``, srun: ``SLURM_PROCID``, mpirun: ``OMPI_COMM_WORLD_RANK``), before any
    process group exists; 0 without a launcher."""
    var = _RANK_VARS.get(launcher)
    value = os.environ.get(var, '0') if var else '0'
    try:
        return int(value)
    except ValueError:
        raise ValueError(f'{var} must be an int (the global rank), got {value!r}') from None


def _start_ticks(pid: int) -> Optional[int]:
    """When ``pid`` started (clock ticks since boot, ``/proc``): with the pid, it tells
    a process from a later one that reuses its pid; None where ``/proc`` is absent."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return int(f.read().rsplit(')', 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _running(holder: dict) -> bool:
    """Whether the process a lock record names still runs (on this host: other hosts'
    processes cannot be seen and count as running)."""
    pid = holder.get('pid')
    if holder.get('host') != socket.gethostname() or not isinstance(pid, int):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = holder.get('start')
    return start is None or _start_ticks(pid) in (None, start)


def _read_record(fd: int) -> dict:
    try:
        data = os.pread(fd, 4096, 0).decode('utf-8', 'replace')
        record = json.loads(data)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


class WorkDirLock:
    """The lock of one work dir (see the module docstring). ``acquire()`` takes it or
    raises :class:`WorkDirBusyError` in one line naming the holder; ``release()`` (also
    run at exit) gives it back and removes the file. A context manager as well."""

    def __init__(self, work_dir: str):
        self.work_dir = work_dir
        self.path = osp.join(osp.abspath(work_dir), LOCK_NAME)
        self.fd = None
        self.previous = None  # the record of a holder whose lock was taken over

    def _busy(self, holder: dict) -> WorkDirBusyError:
        who = f'pid {holder.get("pid", "?")} on {holder.get("host", "?")}'
        if holder.get('since'):
            who += f', since {holder["since"]}'
        return WorkDirBusyError(
            f'work dir {self.work_dir} is in use by another training run ({who}; lock '
            f'{self.path}): wait for it to end, or give another --work-dir',
            holder,
        )

    def _write(self, fd: int) -> None:
        record = dict(
            pid=os.getpid(),
            host=socket.gethostname(),
            start=_start_ticks(os.getpid()),
            since=time.strftime('%Y-%m-%d %H:%M:%S'),
            command=' '.join(sys.argv)[:1000],
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)

    def acquire(self) -> 'WorkDirLock':
        import fcntl

        if self.fd is not None:
            return self
        os.makedirs(self.work_dir, exist_ok=True)
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_record(fd)
                os.close(fd)
                if not _running(holder) and time.monotonic() < deadline:
                    time.sleep(0.5)  # held by the forked children of a process now gone
                    continue
                raise self._busy(holder) from None
            except OSError as err:  # a file system without flock: the record alone
                if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    os.close(fd)
                    raise
                holder = _read_record(fd)
                if holder and holder.get('pid') != os.getpid() and _running(holder):
                    os.close(fd)
                    raise self._busy(holder) from None
            try:  # the file locked is still the one at the path (a run ending unlinks it)
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self.previous = _read_record(fd) or None
            self._write(fd)
            self.fd = fd
            atexit.register(self.release)
            return self

    def release(self) -> None:
        """Give the lock back and remove its file (only the file this run holds)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        atexit.unregister(self.release)
        try:
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                os.remove(self.path)
        except OSError:
            pass
        os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
