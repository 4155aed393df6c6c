"""The softmax of core attention over its cores and its CPU-speed pieces, against the
plain operations (the layer that uses them: tests/ops/test_core.py)."""

import pytest
import torch

from mmcirc.ops.core_softmax import SOFTMAX_WIDTH, Scores, core_softmax, pad_keys


@pytest.mark.parametrize('width', [1, 3, 8, 15, 16, 17])
def test_core_softmax_is_the_softmax_over_the_cores(width):
    s = torch.randn(3, 5, 2, width, dtype=torch.float64) * 10
    p = core_softmax(s)
    assert p.shape == s.shape
    torch.testing.assert_close(p, torch.softmax(s, dim=-1), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize('num_keys', [1, 2, SOFTMAX_WIDTH, SOFTMAX_WIDTH + 1])
def test_padded_keys_are_masked_out(num_keys):
    k, v = torch.randn(2, num_keys, 4), torch.randn(2, num_keys, 4)
    beta = torch.randn(2, 1, num_keys)
    kp, vp, bp = pad_keys(k, v, beta)
    assert num_keys == 1 or kp.shape[1] % SOFTMAX_WIDTH == 0
    x = torch.randn(2, 7, 4)
    want = torch.softmax(torch.baddbmm(beta, x, k.transpose(1, 2)), -1) @ v
    got = torch.softmax(torch.baddbmm(bp, x, kp.transpose(1, 2)), -1) @ vp
    torch.testing.assert_close(got, want)


def test_scores_gradients_are_those_of_baddbmm():
    shapes = [(2, 1, 3), (2, 9, 4), (2, 3, 4)]  # beta, x, k
    args = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    assert torch.autograd.gradcheck(Scores.apply, args)
