"""Shared fixtures of the operator tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The operator tests use tiny tensors: one intra-op thread is fastest and
    avoids OpenMP stalls on a loaded machine. Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
