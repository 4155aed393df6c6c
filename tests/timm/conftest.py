"""Shared by the timm tests: small variants of the registered models (the sizes of the
registered names, through timm's kwargs, with tiny widths and depths); the TorchScript
tests of timm's own suite (test_timm_contract.py) deselected."""

import fnmatch

import pytest
import torch
from timm_variants import SMALL

#: timm's tests left out of test_timm_contract.py, and why (docs/timm.md, TorchScript).
DESELECTED = (
    '*torchscript*',
    'TorchScript is not supported by mmcirc: the circulant and core attentions take '
    'shape-dependent paths that torch.jit.script cannot compile; torch.export, ONNX and '
    'torch.compile are the deployment paths',
)
_DESELECTED_COUNT = pytest.StashKey[int]()
#: the markers of timm's tests/test_models.py (timm's pyproject.toml declares them)
TIMM_MARKERS = (
    'base',
    'cfg',
    'cfg_nonstd',
    'forward',
    'backward',
    'features',
    'fxforward',
    'fxbackward',
    'torchscript',
    'timeout',
)


def pytest_configure(config):
    for name in TIMM_MARKERS:
        config.addinivalue_line('markers', f"{name}: a marker of timm's own tests")


def pytest_collection_modifyitems(config, items):
    pattern, _ = DESELECTED
    out = [
        item
        for item in items
        if item.path.name == 'test_timm_contract.py' and fnmatch.fnmatch(item.name, pattern)
    ]
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [item for item in items if item not in out]
        config.stash[_DESELECTED_COUNT] = len(out)


def pytest_terminal_summary(terminalreporter, config):
    n = config.stash.get(_DESELECTED_COUNT, 0)
    if n:
        pattern, reason = DESELECTED
        terminalreporter.write_line(
            f"test_timm_contract.py: {n} of timm's tests deselected ({pattern}): {reason}"
        )


@pytest.fixture
def small():
    """``small(name, **kwargs)``: the small variant of a registered model, eval mode."""
    import timm

    import mmcirc.timm  # noqa: F401  (registration)

    def make(name, **kwargs):
        torch.manual_seed(0)
        return timm.create_model(name, **dict(SMALL[name], **kwargs)).eval()

    return make
