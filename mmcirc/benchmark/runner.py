"""The isolated-child runner: one measurement in a fresh Python process, with a
timeout and an address-space cap, whose failures are results.

    from mmcirc.benchmark.runner import run_isolated
    res = run_isolated('mmcirc.benchmark.tasks:measure_memory', spec, timeout=300,
                       mem_cap_gb=6)
    res['status']  # 'ok', 'oom', 'timeout' or 'error'

The child is ``python mmcirc/benchmark/runner.py SPEC.json``: a fresh interpreter (fresh
memory counters, no CUDA context inherited, no state of earlier measurements) with the
repository on ``PYTHONPATH``, so it runs from a copy that is not installed, and that imports
only what its target needs (this file as a script: not ``mmcirc``'s ``__init__``, which
registers every model). It imports ``target`` (``'module:function'``), calls
``function(spec)`` and writes the returned dict as JSON to a result file, read once the
child has exited (a file cut short by the child's death is no result); it exits 0
whatever happened.

Status: the function's own ``status`` if it returns one (a measurement that reports a
partial result), else ``'ok'``; an exception in the child is ``'oom'`` when it is an
allocation failure (:func:`mmcirc.utils.memory.is_out_of_memory`), else ``'error'``.
Without a result file the parent classifies the death: killed by the timeout:
``'timeout'``; killed by SIGKILL (the kernel's OOM killer) or an allocation message
in its last output lines (``std::bad_alloc`` aborts): ``'oom'``; anything else:
``'error'`` with the last line of its output. Every result carries ``status``,
``returncode``, ``wall_s`` and, unless ``ok``, ``error``.

``mem_cap_gb`` sets ``RLIMIT_AS`` of the child before it starts (CPU measurements only:
CUDA reserves more address space than any cap allows).
"""

import contextlib
import json
import os
import os.path as osp
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

__all__ = ['STATUSES', 'run_isolated', 'child_main']

#: every status a result of :func:`run_isolated` can have
STATUSES = ('ok', 'oom', 'timeout', 'error')
GB = 1024**3
#: the folder that holds the ``mmcirc`` package (put on the child's PYTHONPATH)
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _error_text(err: BaseException) -> str:
    text = str(err).strip()
    return f'{type(err).__name__}: {text.splitlines()[-1] if text else ""}'.strip()[:500]


def _classify_death(rc: int, tail: str) -> dict:
    """Status and error of a child that left no result (killed, crashed)."""
    from mmcirc.utils.memory import is_out_of_memory

    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    oom = any(is_out_of_memory(ln) for ln in lines[-5:])
    error = lines[-1][:500] if lines else f'exit code {rc}'
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        oom, error = oom or -rc == signal.SIGKILL, f'killed by signal {-rc} ({name})'
    return dict(status='oom' if oom else 'error', error=error)


def run_isolated(
    target: str, spec: dict, *, timeout: Optional[float] = None,
    mem_cap_gb: Optional[float] = None, env: Optional[dict] = None, cwd: Optional[str] = None,
) -> dict:  # fmt: skip
    """Run ``target`` (``'module:function'``) on ``spec`` (JSON-able) in a fresh child;
    see the module docstring. ``env``: extra environment variables of the child."""
    if not isinstance(target, str) or target.count(':') != 1:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f'timeout must be > 0 seconds or None, got {timeout!r}')
    if mem_cap_gb is not None and not mem_cap_gb > 0:
        raise ValueError(f'mem_cap_gb must be > 0 or None, got {mem_cap_gb!r}')
    tmpdir = tempfile.mkdtemp(prefix='mmcirc_child_')
    paths = {k: osp.join(tmpdir, k) for k in ('spec.json', 'result.json', 'child.log')}
    with open(paths['spec.json'], 'w') as f:
        json.dump(dict(target=target, spec=spec, result=paths['result.json']), f)
    child_env = dict(os.environ, **(env or {}))
    child_env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO, child_env.get('PYTHONPATH')) if p)
    cap = None if mem_cap_gb is None else int(mem_cap_gb * GB)
    limit = None if cap is None else lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    cmd = [sys.executable, osp.abspath(__file__), paths['spec.json']]
    t0, timed_out = time.perf_counter(), False
    try:
        with open(paths['child.log'], 'wb') as log:
            try:
                rc = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=cwd,
                    preexec_fn=limit, timeout=timeout,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:  # run() has killed it
                rc, timed_out = -signal.SIGKILL, True
        wall = time.perf_counter() - t0
        with open(paths['child.log'], 'rb') as f:
            f.seek(max(osp.getsize(paths['child.log']) - 4000, 0))
            tail = f.read().decode('utf-8', 'replace')
        result = {}
        with contextlib.suppress(OSError, ValueError):  # none, or cut short by a death
            with open(paths['result.json']) as f:
                result = json.load(f)
        if timed_out:
            result.update(status='timeout', error=f'timeout (> {timeout:g} s)')
        elif not result:
            result = _classify_death(rc, tail)
        result.update(returncode=rc, wall_s=round(wall, 3))
        if result['status'] != 'ok':
            result.setdefault('error', tail.strip().splitlines()[-1][:500] if tail.strip() else '')
            result['log_tail'] = tail[-1500:]
        return result
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def child_main(argv=None) -> None:
    """The child's entry (``python mmcirc/benchmark/runner.py SPEC.json``)."""
    import importlib

    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        job = json.load(f)
    try:
        module, name = job['target'].split(':')
        out = getattr(importlib.import_module(module), name)(job['spec'])
        if not isinstance(out, dict):
            raise TypeError(f'{job["target"]} must return a dict, got {type(out).__name__}')
        out = dict(out)
        out.setdefault('status', 'ok')
    except BaseException as err:  # noqa: BLE001  (every failure is a result)
        from mmcirc.utils.memory import is_out_of_memory  # (imports mmcirc: failures only)

        out = dict(status='oom' if is_out_of_memory(err) else 'error', error=_error_text(err))
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    out['rlimit_as_gb'] = None if soft == resource.RLIM_INFINITY else round(soft / GB, 2)
    try:
        text = json.dumps(out)
    except (TypeError, ValueError) as err:
        text = json.dumps(dict(status='error', error=f'result is not JSON: {err}'[:500]))
    with open(job['result'], 'w') as f:
        f.write(text)


if __name__ == '__main__':
    sys.path[0] = REPO  # the repository, not this folder (its modules are not top-level ones)
    child_main()
