"""The layout rule of mmcirc.ops.layout: the device's, or MMCIRC_LAYOUT's."""

import os
import subprocess
import sys

import pytest
import torch

from mmcirc.ops import layout


def test_cpu_tensor_takes_the_cpu_layout_by_default():
    with layout.forced_layout(None):
        assert layout.cpu_layout(torch.zeros(1))


def test_forced_cuda_layout_applies_to_cpu_tensors_and_is_restored():
    with layout.forced_layout(None):
        with layout.forced_layout('cuda'):
            assert not layout.cpu_layout(torch.zeros(1))
            assert layout.FORCED == 'cuda'
        assert layout.cpu_layout(torch.zeros(1))


def test_unknown_layout_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^layout must be one of \('cpu', 'cuda'\)"):
        with layout.forced_layout('gpu'):
            pass


@pytest.mark.parametrize('value, expected', [('cuda', 'cuda'), ('cpu', 'cpu'), ('', 'None')])
def test_environment_variable_sets_the_override(value, expected):
    env = dict(os.environ, MMCIRC_LAYOUT=value)
    code = 'from mmcirc.ops import layout; print(layout.FORCED)'
    out = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected


def test_environment_variable_with_an_unknown_value_refused():
    env = dict(os.environ, MMCIRC_LAYOUT='gpu')
    out = subprocess.run(
        [sys.executable, '-c', 'import mmcirc.ops.layout'], env=env, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert "ValueError: MMCIRC_LAYOUT must be one of ('cpu', 'cuda') (or unset), got 'gpu'" in (
        out.stderr
    )
