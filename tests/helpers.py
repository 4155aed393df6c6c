"""Helpers shared by the tests: paths of the repo and a runner for its tools."""
import os
import os.path as osp
import subprocess
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
FIXTURE_CONFIGS = osp.join(REPO, 'tests', 'fixtures', 'configs')


def run_tool(args, cwd, timeout=900, env=None, check=True):
    """Run ``args`` (a tools/ script and its arguments) with this Python in ``cwd``."""
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', PYTHON=sys.executable, **(env or {}))
    full_env['PYTHONPATH'] = REPO + os.pathsep + full_env.get('PYTHONPATH', '')
    if args[0].endswith('.py'):
        args = [sys.executable, osp.join(REPO, args[0]), *args[1:]]
    else:
        args = ['bash', osp.join(REPO, args[0]), *args[1:]]
    proc = subprocess.run(args, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f'{" ".join(args)} failed ({proc.returncode}):\n'
                             f'{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}')
    return proc
