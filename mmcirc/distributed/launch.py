"""Run one function on P local processes joined in a torch.distributed process group.

``torchrun`` is the launcher for real runs (each rank calls :func:`init_from_env` and
leaves through :func:`leaving_group`); :func:`run_parallel` is the in-Python
equivalent for tests and ``--nproc P``: it starts P processes, each joins a gloo (CPU)
or NCCL (GPU) group over TCP on the loopback address, runs ``fn(*args)`` and sends its
return value back. A rank that raises makes the whole call raise one ``RuntimeError``
naming that rank and its error; the other ranks are ended (they may be blocked in a
collective waiting for it).
"""

import contextlib
import os
import pickle
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, List, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mmcirc.ops.core import check_positive

__all__ = ['free_port', 'init_from_env', 'is_secondary_error', 'leaving_group', 'run_parallel']


def free_port() -> int:
    """A TCP port on the loopback address that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def init_from_env(backend: str = None, timeout_s: float = 600) -> None:
    """Join the group ``torchrun`` describes in the environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); ``backend``: 'gloo', 'nccl' or None (NCCL when CUDA is
    available, else gloo)."""
    if not dist.is_initialized():
        backend = backend or ('nccl' if torch.cuda.is_available() else 'gloo')
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))


@contextlib.contextmanager
def leaving_group():
    """Run the body, then leave the default process group (if one is joined) cleanly.

    A process that exits with its gloo group still alive can die in interpreter
    teardown with ``terminate called without an active exception`` (SIGABRT: the
    group's C++ threads outlive Python), which torchrun reports as a failed rank
    although all its work was done. After a body that returns, every rank waits for
    the others (none tears down a group a peer still reads from) and the group is
    destroyed while the interpreter is whole; after one that raises (``SystemExit``
    too), it is destroyed without waiting, since the peers may be gone.
    """
    try:
        yield
    except BaseException:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        raise
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _worker(rank, world_size, port, backend, fn, args, threads, queue):
    try:
        if isinstance(args, bytes):  # pickled by value by a parent that did not fork
            args = pickle.loads(args)
        torch.set_num_threads(threads)
        dist.init_process_group(
            backend,
            init_method=f'tcp://127.0.0.1:{port}',
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=600),
        )
        # plain pickle: by value (torch's reducers would pass a file descriptor that
        # dies with this process)
        message = (rank, True, pickle.dumps(fn(*args)))
    except BaseException as exc:  # reported to the parent, which raises
        last = traceback.format_exc().strip().splitlines()[-1]
        message = (rank, False, f'{type(exc).__name__}: {exc}' if str(exc) else last)
    # reported before the group is torn down: the peers only see this rank's sockets
    # close afterwards, so a failing rank's own error reaches the parent before their echo
    queue.put(message)
    if dist.is_initialized():
        # what this rank had to say is sent: a failing teardown must not turn into a
        # non-zero exit that the parent would read as a rank lost without a result
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


#: How :func:`run_parallel` can start its processes.
START_METHODS = ('fork', 'forkserver', 'spawn')


def run_parallel(
    fn: Callable,
    nprocs: int,
    args: Sequence = (),
    backend: str = 'gloo',
    start_method: str = 'fork',
    threads: int = 1,
    timeout_s: float = 900,
) -> List[Any]:
    """``[fn(*args) on rank r for r in range(nprocs)]``, each rank a process of one group.

    ``start_method``: 'fork' (fast: the children share what the parent imported),
    'forkserver' (the children fork from a clean server process that preloaded ``fn``'s
    module) or 'spawn'; with the last two ``fn`` must be importable by name. Ranks that
    run ``backward`` need 'forkserver' or 'spawn' once this process ran a backward that
    started autograd's worker threads (a compiled one does): those threads do not
    survive a fork. ``threads``: torch threads per rank; more than one makes 'fork'
    'spawn' (a forked child that runs OpenMP regions after its parent did can deadlock:
    libgomp's thread pool does not survive a fork).
    Return values travel pickled by value through a multiprocessing queue."""
    check_positive('nprocs', nprocs)
    if backend not in ('gloo', 'nccl'):
        raise ValueError(f"backend must be one of ('gloo', 'nccl'), got {backend!r}")
    if start_method not in START_METHODS:
        raise ValueError(f'start_method must be one of {START_METHODS}, got {start_method!r}')
    if threads > 1 and start_method == 'fork':
        start_method = 'spawn'
    ctx = mp.get_context(start_method)
    if start_method == 'forkserver' and fn.__module__ != '__main__':
        # taken by the server when it starts (the first call): its children then find
        # fn's module and what it imports already loaded
        ctx.set_forkserver_preload([fn.__module__])
    queue = ctx.SimpleQueue() if start_method == 'fork' else ctx.Queue()
    port = free_port()
    # not forked: by value, as plain pickle writes tensors (multiprocessing's own pickler
    # would pass every tensor's storage as a file descriptor, which a fork server caps)
    payload = tuple(args) if start_method == 'fork' else pickle.dumps(tuple(args))
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, nprocs, port, backend, fn, payload, threads, queue),
            daemon=True,
        )
        for r in range(nprocs)
    ]
    env_before = os.environ.get('OMP_NUM_THREADS')
    os.environ['OMP_NUM_THREADS'] = str(threads)
    try:
        for p in procs:
            p.start()
    finally:
        if env_before is None:
            os.environ.pop('OMP_NUM_THREADS', None)
        else:
            os.environ['OMP_NUM_THREADS'] = env_before
    results, error = {}, None
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < nprocs and error is None:
            got = _get(queue, procs, deadline)
            if got is None:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results]
                error = (
                    f'rank {dead[0]} exited with code {procs[dead[0]].exitcode} without a result'
                    if dead
                    else f'timed out after {timeout_s:g} s'
                )
                break
            rank, ok, value = got
            if ok:
                results[rank] = pickle.loads(value)
            else:
                error = _first_cause(rank, value, queue, procs)
    finally:
        for p in procs:
            if error is not None and p.is_alive():
                p.terminate()
            p.join(timeout=30)
    if error is not None:
        raise RuntimeError(error)
    return [results[r] for r in range(nprocs)]


#: How a rank's error reads when it only failed because another rank did.
_SECONDARY = ('Connection closed by peer', 'Connection reset by peer', 'remote worker', 'aborted')


def is_secondary_error(message: str) -> bool:
    """Whether a rank's error ``message`` is the echo of another rank's failure (its
    peer's sockets closed), not a cause of its own."""
    return any(s in message for s in _SECONDARY)


def _first_cause(rank, message, queue, procs, grace_s=3.0):
    """The error to report: the first one that is not the echo of another rank's failure
    (waits ``grace_s`` for the others' messages)."""
    errors = [(rank, message)]
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.is_alive() for p in procs):
        got = _get(queue, procs, deadline)
        if got is None:
            break
        if not got[1]:
            errors.append((got[0], got[2]))
    for r, msg in errors:
        if not is_secondary_error(msg):
            return f'rank {r} failed: {msg}'
    return f'rank {errors[0][0]} failed: {errors[0][1]}'


def _get(queue, procs, deadline, poll_s=0.2):
    """The next message, or None once a process died without sending one or the
    deadline passed."""
    while time.monotonic() < deadline:
        if queue._reader.poll(poll_s):  # SimpleQueue / Queue: a Connection
            return queue.get()
        # a child that died without a message (killed, out of memory)
        if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs):
            return queue.get() if queue._reader.poll(poll_s) else None
        time.sleep(0.01)
    return None
