"""Shared settings of the model tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope='package')
def single_torch_thread():
    """The model tests run tiny tensors: one intra-op thread is 2-3x faster than
    several on a loaded 2-core machine. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
