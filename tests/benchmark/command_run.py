"""``python -m mmcirc.benchmark ARGS`` in a child process, as a user runs it."""

import os
import subprocess
import sys

from helpers import REPO


def run_benchmark(args, cwd, check=True):
    """Run the command in ``cwd`` (one torch thread); a failure raises with its output
    unless ``check`` is false."""
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-m', 'mmcirc.benchmark', *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(
            f'{" ".join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}'
        )
    return proc
