"""Importing mmcirc leaves mmengine's checkpoint I/O alone; SafeCheckpointIOHook (named by
every shipped config) and the install functions switch safe loading and atomic saving on."""

import glob
import json
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config
from mmengine.fileio import get_file_backend
from mmengine.hooks import checkpoint_hook
from mmengine.runner.checkpoint import CheckpointLoader

from helpers import FIXTURE_CONFIGS, REPO
from mmcirc.engine import (
    AtomicLocalBackend,
    SafeCheckpointIOHook,
    install_atomic_saving,
    install_safe_loader,
    load_from_local,
)

# mmengine's loaders, file backends and checkpoint-hook ``open`` before and after importing
_RECORD = """
import json
from mmengine.fileio.backends import backends, prefix_to_backends
from mmengine.hooks import checkpoint_hook
from mmengine.runner.checkpoint import CheckpointLoader

def state():
    name = lambda obj: f'{obj.__module__}.{obj.__qualname__}'
    return dict(
        schemes=[[p, name(f)] for p, f in CheckpointLoader._schemes.items()],
        backends={k: name(c) for k, c in backends.items()},
        prefixes={k: name(c) for k, c in prefix_to_backends.items()},
        hook_open=repr(vars(checkpoint_hook).get('open')),
    )

before = state()
import mmcirc, mmcirc.models, mmcirc.engine
print(json.dumps(dict(before=before, after=state())))
"""

SHIPPED = sorted(
    osp.relpath(p, osp.join(REPO, 'configs'))
    for p in glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
)


def _installed():
    """Whether mmengine uses mmcirc's loader, atomic backend and hook ``open`` (each)."""
    return (
        CheckpointLoader._get_checkpoint_loader('/any/x.pth') is load_from_local,
        isinstance(get_file_backend('/any/x.pth'), AtomicLocalBackend),
        checkpoint_hook.open is not open,
    )


def test_importing_mmcirc_leaves_mmengine_checkpoint_io_alone():
    proc = subprocess.run(
        [sys.executable, '-c', _RECORD],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state['after'] == state['before']


def test_hook_installs_safe_loading_and_atomic_saving(mmengine_own_io):
    from mmdet.registry import HOOKS  # a library's registry, as a config's runner uses

    hook = HOOKS.build(dict(type='SafeCheckpointIOHook'))
    assert _installed() == (False, False, False)
    hook.before_run(runner=None)
    assert _installed() == (True, True, True)


def test_installing_twice_changes_nothing(mmengine_own_io):
    def state():
        return (
            list(CheckpointLoader._schemes.items()),
            type(get_file_backend('/x')),
            repr(checkpoint_hook.open),
        )

    install_safe_loader()
    install_atomic_saving()
    once = state()
    install_safe_loader()
    install_atomic_saving()
    assert state() == once and _installed() == (True, True, True)


@pytest.mark.parametrize('name', SHIPPED)
def test_shipped_config_enables_the_hook(name):
    cfg = Config.fromfile(osp.join(REPO, 'configs', name))
    hooks = [*cfg.get('default_hooks', {}).values(), *cfg.get('custom_hooks', [])]
    assert any(h and h.get('type') == 'SafeCheckpointIOHook' for h in hooks)


def test_runner_of_a_tiny_config_holds_the_hook(tmp_path):
    from mmengine.runner import Runner

    cfg = Config.fromfile(osp.join(FIXTURE_CONFIGS, 'ca_pvt_fpn_tiny.py'))
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    assert any(isinstance(h, SafeCheckpointIOHook) for h in runner.hooks)
