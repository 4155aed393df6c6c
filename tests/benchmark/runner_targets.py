"""Child targets of tests/benchmark/test_bench_runner.py (imported by the isolated child:
the test puts this folder on the child's PYTHONPATH)."""

import os
import signal
import sys
import time


def echo(spec):
    return dict(doubled=2 * spec['x'], pid=os.getpid())


def allocate_bytes(spec):
    """Python's allocator under the cap: MemoryError."""
    block = bytearray(spec['gib'] << 30)
    return dict(allocated=len(block))


def allocate_tensor(spec):
    """torch's CPU allocator under the cap: RuntimeError "can't allocate memory"."""
    import torch

    t = torch.empty(spec['gib'] << 30, dtype=torch.uint8)
    return dict(allocated=t.numel())


def raise_value_error(spec):
    raise ValueError('size must be positive, got -1')


def killed(spec):
    """What the kernel's OOM killer does: SIGKILL, no result written."""
    os.kill(os.getpid(), signal.SIGKILL)


def aborts_with_bad_alloc(spec):
    """A C++ allocation failure: the runtime prints this and aborts."""
    print("terminate called after throwing an instance of 'std::bad_alloc'", flush=True)
    sys.stdout.flush()
    os.abort()


def exits_hard(spec):
    print('something went wrong', flush=True)
    os._exit(3)


def sleeps(spec):
    time.sleep(spec['seconds'])
    return {}


def partial(spec):
    return dict(status='oom', failed_during='inference', time_s=1.5)
