"""``kernel='triton'`` where the kernel does not apply: the layer says why in one warning
per layer shape and reason, and runs its torch path; the operator
``mmcirc::circulant_core`` called directly refuses what it cannot compute in one line
(``TypeError`` / ``ValueError`` naming the argument and what it takes)."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

from helpers import REPO
from mmcirc.ops import CirculantAttention, circulant_kernel
from mmcirc.ops.circulant_kernel import circulant_core


@pytest.fixture(autouse=True)
def _fresh_reports(monkeypatch):
    monkeypatch.setattr(circulant_kernel, '_REPORTED', set())


def _warnings(layer, shapes, dtype=torch.float32):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for hw in shapes:
            with torch.no_grad():
                layer(torch.zeros(1, hw[0] * hw[1], layer.dim, dtype=dtype), hw)
    return [str(w.message) for w in caught if 'triton' in str(w.message)]


def test_a_map_over_the_limit_says_size_once_per_shape():
    layer = CirculantAttention(4, boundary='zero', kernel='triton')
    said = _warnings(layer, [(40, 8), (40, 8), (8, 40), (40, 8)])
    assert len(said) == 2, said
    assert said[0].startswith("kernel='triton' does not apply to CirculantAttention(dim=4")
    assert said[0].endswith(
        'on a 40x8 map, which runs the torch.fft path: size: the 40x8 map makes a 79x15 DFT '
        "grid, above 64 cells a side; boundary 'zero' takes maps up to 32x32"
    )
    assert 'on a 8x40 map' in said[1]


def test_float64_tokens_say_dtype():
    layer = CirculantAttention(4, kernel='triton').double()
    (said,) = _warnings(layer, [(4, 4), (4, 4)], dtype=torch.float64)
    assert said.endswith(
        'torch.fft path: dtype: float64 tokens; it takes float32, bfloat16, float16'
    )


def test_the_torch_kernel_says_nothing():
    assert _warnings(CirculantAttention(4, kernel='torch'), [(80, 80)]) == []


def _tokens(hw=(4, 4), c=4, dtype=torch.float32):
    return [torch.zeros(1, hw[0] * hw[1], c, dtype=dtype) for _ in range(3)]


def test_the_operator_refuses_float64():
    with pytest.raises(
        TypeError, match=r'^circulant_core: q must be float32, bfloat16, float16, got float64$'
    ):
        circulant_core(*_tokens(dtype=torch.float64), None, 4, 4, 1, False, 0.5)


@pytest.mark.parametrize('hw, zero', [((65, 2), False), ((2, 33), True)])
def test_the_operator_refuses_a_grid_over_the_limit(hw, zero):
    with pytest.raises(
        ValueError, match=r'^circulant_core: h, w: the .* DFT grid, above 64 cells a side'
    ):
        circulant_core(*_tokens(hw), None, *hw, 1, zero, 0.5)


def test_the_operator_refuses_cpu_tensors_without_the_interpreter():
    """A fresh process without TRITON_INTERPRET: one line, not Triton's '0 active drivers'."""
    code = (
        'import torch\n'
        'from mmcirc.ops.circulant_kernel import circulant_core\n'
        'q = torch.zeros(1, 16, 4)\n'
        'try:\n'
        '    circulant_core(q, q, q, None, 4, 4, 1, False, 0.5)\n'
        'except ValueError as err:\n'
        '    print(err)\n'
    )
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = REPO
    proc = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.stdout.strip() == (
        'circulant_core: q is a cpu tensor: the kernel runs on cuda, or on cpu in '
        "Triton's interpreter (TRITON_INTERPRET=1 before its first use)"
    ), proc.stderr[-2000:]
