"""Fixtures: mmengine's own checkpoint I/O, or mmcirc's installed, for one test."""

import pytest
from mmengine.fileio import io as mmengine_io
from mmengine.fileio.backends import LocalBackend, backends, prefix_to_backends
from mmengine.hooks import checkpoint_hook
from mmengine.runner import checkpoint as mmengine_checkpoint

from mmcirc.engine import install_atomic_saving, install_safe_loader


@pytest.fixture
def mmengine_own_io(monkeypatch):
    """mmengine's own local checkpoint loader, local file backend and checkpoint-hook
    ``open`` during the test (whatever an earlier test installed); put back after."""
    loader = mmengine_checkpoint.CheckpointLoader
    schemes = loader._schemes.copy()
    schemes[''] = mmengine_checkpoint.load_from_local
    monkeypatch.setattr(loader, '_schemes', schemes)
    monkeypatch.setitem(backends, 'local', LocalBackend)
    monkeypatch.setitem(prefix_to_backends, '', LocalBackend)
    monkeypatch.setattr(mmengine_io, 'backend_instances', {})
    monkeypatch.setattr(checkpoint_hook, 'open', open, raising=False)


@pytest.fixture
def safe_io(mmengine_own_io):
    """mmcirc's safe loader and atomic saving installed, as a user opts in."""
    install_safe_loader()
    install_atomic_saving()
