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
