"""Shared fixtures: the generated toy datasets."""

import os.path as osp
import subprocess
import sys

import pytest
import torch

from helpers import REPO


@pytest.fixture(scope='session')
def toy_root(tmp_path_factory):
    """A folder holding data/toy_coco, data/toy_ade and data/toy_imagenet (small)."""
    root = tmp_path_factory.mktemp('toy')
    subprocess.run(
        [
            sys.executable,
            osp.join(REPO, 'tools', 'dataset_converters', 'make_toy_data.py'),
            'all',
            '--out',
            str(root / 'data'),
            '--num-train',
            '24',
            '--num-val',
            '8',
        ],
        check=True,
        capture_output=True,
    )
    return root


def _drop_new_default_scopes():
    """mmengine's ``DefaultScope`` is process-global and its newest instance decides which
    library's registry every ``MODELS.build`` searches: a Runner, ``init_model`` or config
    built in one test would otherwise change how the next test builds (e.g. mmdet's
    ``FPN`` looked up in mmpretrain). Yields, then drops the instances made meanwhile."""
    try:
        from mmengine.registry import DefaultScope
    except ImportError:  # a torch-only machine: tests/ops/test_cuda.py on the lent GPU
        yield
        return
    before = set(DefaultScope._instance_dict)
    yield
    for name in [n for n in DefaultScope._instance_dict if n not in before]:
        DefaultScope._instance_dict.pop(name, None)


@pytest.fixture(autouse=True, scope='module')
def _default_scope_per_module():
    yield from _drop_new_default_scopes()


@pytest.fixture(autouse=True)
def _default_scope_per_test():
    yield from _drop_new_default_scopes()


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for the test (tiny tensors: faster than two, and no OpenMP
    stalls when the machine is busy); restored afterwards. Use with
    ``pytestmark = pytest.mark.usefixtures('one_torch_thread')``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def two_torch_threads():
    """Two intra-op threads for the test (long exports: twice as fast as one on an idle
    machine); restored afterwards. Use with
    ``pytestmark = pytest.mark.usefixtures('two_torch_threads')``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def triton_interpreter():
    """Triton's interpreter for the module's tests (``TRITON_INTERPRET=1``; the kernels of
    mmcirc.ops.circulant_triton read it when they are defined, so they are defined again
    where they were first imported without it); the environment restored afterwards."""
    mp = pytest.MonkeyPatch()
    mp.setenv('TRITON_INTERPRET', '1')
    from mmcirc.ops import circulant_kernel

    if circulant_kernel.kernel_refusal(torch.zeros(1), (4, 4), 'circular') is not None:
        import importlib

        from mmcirc.ops import circulant_triton

        importlib.reload(circulant_triton)
    yield
    mp.undo()
