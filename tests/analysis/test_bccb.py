"""mmcirc.analysis.bccb: the BCCB projection against a brute-force average over explicit
offset classes, its projection properties, the circulant operator's own matrix (from
the dense reference) at distance 0, and the helpers the tools use."""

import itertools
import math

import pytest
import torch
from ops.dense_reference import circulant_attention_dense

from mmcirc.analysis.bccb import (
    bccb_distance,
    bccb_expand,
    bccb_kernel,
    bccb_project,
    centre_kernel,
    gather_entropy,
    shuffle_tokens,
)

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _random_attention(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(*shape, generator=g, dtype=torch.float64) * 2, dim=-1)


def _brute_projection(attn, q_grid, k_grid):
    """P(A) by the definition, with Python ints: group the pairs (i, j) by the wrapped
    offset of key j from the key cell that covers query i, average each group."""
    (hq, wq), (hk, wk) = q_grid, k_grid
    groups = {}
    for (r, c), (kr, kc) in itertools.product(
        itertools.product(range(hq), range(wq)), itertools.product(range(hk), range(wk))
    ):
        cr, cc = math.floor(r * hk / hq), math.floor(c * wk / wq)
        m = ((kr - cr) % hk, (kc - cc) % wk)
        groups.setdefault(m, []).append((r * wq + c, kr * wk + kc))
    out = torch.empty_like(attn)
    for pairs in groups.values():
        i, j = torch.tensor(pairs).T
        out[..., i, j] = attn[..., i, j].mean(-1, keepdim=True)
    return out


def _bccb_from_kernel(kernel):
    """BCCB matrix M[i, j] = kernel[(rj - ri) mod H, (cj - ci) mod W], by loops."""
    h, w = kernel.shape
    m = torch.empty(h * w, h * w, dtype=kernel.dtype)
    for ri, ci, rj, cj in itertools.product(range(h), range(w), range(h), range(w)):
        m[ri * w + ci, rj * w + cj] = kernel[(rj - ri) % h, (cj - ci) % w]
    return m


# --------------------------------------------------------------------------- projection
def test_bccb_matrix_is_its_own_projection():
    kernel = torch.rand(3, 5, dtype=torch.float64)
    m = _bccb_from_kernel(kernel)
    torch.testing.assert_close(bccb_project(m, (3, 5)), m)
    torch.testing.assert_close(bccb_kernel(m, (3, 5)), kernel)
    assert bccb_distance(m, (3, 5)).item() < 1e-7


@pytest.mark.parametrize('q_grid,k_grid', [((3, 4), (3, 4)), ((6, 4), (3, 2)), ((5, 7), (2, 3))])
def test_projection_matches_brute_force_class_average(q_grid, k_grid):
    attn = _random_attention(2, q_grid[0] * q_grid[1], k_grid[0] * k_grid[1])
    torch.testing.assert_close(
        bccb_project(attn, q_grid, k_grid), _brute_projection(attn, q_grid, k_grid)
    )


@pytest.mark.parametrize('q_grid,k_grid', [((4, 5), None), ((6, 4), (3, 2))])
def test_projection_is_idempotent(q_grid, k_grid):
    kg = k_grid or q_grid
    attn = _random_attention(3, q_grid[0] * q_grid[1], kg[0] * kg[1], seed=1)
    once = bccb_project(attn, q_grid, k_grid)
    torch.testing.assert_close(bccb_project(once, q_grid, k_grid), once)


@pytest.mark.parametrize('q_grid,k_grid', [((4, 5), None), ((6, 4), (3, 2))])
def test_projection_is_frobenius_orthogonal(q_grid, k_grid):
    kg = k_grid or q_grid
    attn = _random_attention(3, q_grid[0] * q_grid[1], kg[0] * kg[1], seed=2)
    proj = bccb_project(attn, q_grid, k_grid)
    inner = ((attn - proj) * proj).sum((-2, -1))
    assert inner.abs().max().item() < 1e-12
    # and so P(A) is the nearest: any other offset-only matrix is farther
    other = bccb_expand(bccb_kernel(attn, q_grid, k_grid) + 0.01, q_grid)
    assert ((attn - other).norm(dim=(-2, -1)) > (attn - proj).norm(dim=(-2, -1))).all()


def test_distance_equals_direct_frobenius_ratio():
    attn = _random_attention(2, 3, 20, 20, seed=3)
    direct = (attn - bccb_project(attn, (4, 5))).norm(dim=(-2, -1)) / attn.norm(dim=(-2, -1))
    torch.testing.assert_close(bccb_distance(attn, (4, 5)), direct)
    assert direct.min().item() > 0.1  # a random softmax matrix is far from BCCB
    pooled = (attn - bccb_project(attn, (4, 5))).square().sum((0, -2, -1)) / attn.square().sum(
        (0, -2, -1)
    )
    torch.testing.assert_close(bccb_distance(attn, (4, 5), reduce_dims=(0,)), pooled.sqrt())


def test_reduced_key_grid_kernel_equals_query_pooled_kernel():
    """With Hq = s*Hk (SRA) the kernel is that of the matrix whose query rows are
    averaged over each s x s cell (the comparison on the reduced grid)."""
    attn = _random_attention(24, 6, seed=4)  # queries 6x4, keys 3x2, s = 2
    pooled = attn.view(3, 2, 2, 2, 6).mean((1, 3)).reshape(6, 6)  # (Hk, s, Wk, s) cells
    torch.testing.assert_close(bccb_kernel(attn, (6, 4), (3, 2)), bccb_kernel(pooled, (3, 2)))


@pytest.mark.parametrize('hw', [(4, 5), (3, 3)])
def test_circulant_attentions_own_matrix_is_bccb(hw):
    """A from the dense reference (v = one-hot tokens, so A v = A) is at distance 0,
    and its kernel is a probability map over the offsets."""
    h, w = hw
    n = h * w
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, h, w, n, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.eye(n, dtype=torch.float64).view(1, h, w, n)
    attn = circulant_attention_dense(q, k, v, num_heads=1).view(n, n)  # rows: A[i, :]
    assert bccb_distance(attn, hw).item() < 1e-7
    torch.testing.assert_close(bccb_kernel(attn, hw).sum(), torch.tensor(1.0, dtype=torch.float64))
    zero = circulant_attention_dense(q, k, v, boundary='zero', num_heads=1).view(n, n)
    assert bccb_distance(zero, hw).item() > 1e-3  # no wrap-around: not circulant


def test_shuffled_tokens_keep_entries_and_break_bccb():
    m = _bccb_from_kernel(
        torch.softmax(torch.randn(4, 4, dtype=torch.float64).flatten(), 0).view(4, 4)
    )
    s = shuffle_tokens(m, torch.Generator().manual_seed(0))
    torch.testing.assert_close(s.flatten().sort().values, m.flatten().sort().values)
    torch.testing.assert_close(s.sum(-1).sort().values, m.sum(-1).sort().values)
    assert bccb_distance(s, (4, 4)).item() > 0.1


def test_bad_grid_is_a_value_error():
    with pytest.raises(ValueError, match='attn must end in'):
        bccb_kernel(torch.rand(6, 6), (2, 2))
    with pytest.raises(ValueError, match='q_grid'):
        bccb_kernel(torch.rand(6, 6), (2, 0))


def test_centre_kernel_puts_offset_zero_in_the_middle():
    k = torch.zeros(5, 4)
    k[0, 0] = 1
    assert centre_kernel(k).nonzero().tolist() == [[2, 2]]


def test_gather_entropy_uniform_and_one_hot():
    w = torch.tensor([[0.25] * 4, [1.0, 0, 0, 0]])
    torch.testing.assert_close(
        gather_entropy(w), torch.tensor([math.log(4), 0.0], dtype=torch.float64)
    )
