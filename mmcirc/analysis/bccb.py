"""BCCB projection of attention matrices (what an attention learned), and the
distribution statistics the attention tools report.

**BCCB projection.** Tokens lie on a 2-D grid in row-major order. For an attention
matrix ``A`` of ``Nq = Hq*Wq`` queries on an ``Hq x Wq`` grid and ``Nk = Hk*Wk`` keys
on an ``Hk x Wk`` grid, query ``i = (r, c)`` is placed on the key grid at the cell

    cell(i) = (floor(r * Hk / Hq), floor(c * Wk / Wq))

(the identity when both grids are equal; for PVT's spatial-reduction attention, whose
keys come from an ``s x s`` strided conv, the key cell that covers the query), and the
pair ``(i, j)`` gets the wrapped 2-D offset

    m(i, j) = (j - cell(i)) mod (Hk, Wk)       (one of Hk*Wk offsets)

The projection onto the matrices that depend on the offset only (for equal grids
exactly the block-circulant matrices with circulant blocks, BCCB) averages A over
each offset class:

    p[m]       = (1 / Nq) * sum_i A[i, cell(i) (+) m]        (the kernel, Hk x Wk)
    P(A)[i, j] = p[m(i, j)]

Each class holds exactly one entry of every row (for a fixed ``i``, ``j -> m(i, j)`` is
a bijection), hence the ``1 / Nq``. Averaging over the classes of a partition of the
entries is the orthogonal projection (Frobenius inner product) onto the matrices that
are constant on the classes: ``P(P(A)) = P(A)``, ``<A - P(A), P(A)> = 0``, and a BCCB
matrix is its own projection. The score is the relative Frobenius distance

    d(A) = ||A - P(A)||_F / ||A||_F  =  sqrt(1 - Nq * sum_m p[m]^2 / ||A||_F^2)

(the second form by orthogonality, ``||P(A)||^2 = Nq * sum_m p[m]^2``), 0 for a BCCB
matrix; it is computed from the second form in float64, so the full ``P(A)`` is never
materialised. SRA's reduced key grid is therefore handled at full query resolution with
offsets measured in key-grid units: with ``Hq = s*Hk`` the kernel equals the kernel of
the matrix whose query rows are averaged over each ``s x s`` cell (the comparison "on
the reduced grid"), while ``d`` also counts how much the queries inside one cell differ.
For Swin's window attention the grid is the window (``A`` per window, offsets wrap
inside the window); ``d`` of a head is then the distance of the block-diagonal matrix
of all its windows, ``sqrt(sum_w ||A_w - P(A_w)||^2 / sum_w ||A_w||^2)``.

The weights come from :mod:`mmcirc.analysis.attention_maps` (the capture). This file
needs torch only.
"""

from typing import Optional, Tuple

import torch

__all__ = [
    'query_cells',
    'offset_index',
    'bccb_kernel',
    'bccb_expand',
    'bccb_project',
    'bccb_distance',
    'shuffle_tokens',
    'centre_kernel',
    'gather_entropy',
]


# --------------------------------------------------------------------------- checks
def _grid(name, grid) -> Tuple[int, int]:
    if (
        not isinstance(grid, (tuple, list, torch.Size))
        or len(grid) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in grid)
    ):
        raise ValueError(f'{name} must be (H, W) with positive ints, got {grid!r}')
    return int(grid[0]), int(grid[1])


def _check_attn(attn, q_grid, k_grid):
    if not isinstance(attn, torch.Tensor) or attn.dim() < 2:
        raise ValueError(
            f'attn must be a tensor (..., Nq, Nk), got {getattr(attn, "shape", type(attn))}'
        )
    nq, nk = q_grid[0] * q_grid[1], k_grid[0] * k_grid[1]
    if tuple(attn.shape[-2:]) != (nq, nk):
        raise ValueError(
            f'attn must end in (Nq, Nk) = ({nq}, {nk}) for q_grid={q_grid} and '
            f'k_grid={k_grid}, got {tuple(attn.shape)}'
        )


# --------------------------------------------------------------------------- BCCB math
def query_cells(q_grid, k_grid, device=None) -> torch.Tensor:
    """Key-grid cell of every query: (Nq,) long, ``cell(i)`` of the module docstring as
    a row-major index into the ``Hk x Wk`` grid."""
    (hq, wq), (hk, wk) = _grid('q_grid', q_grid), _grid('k_grid', k_grid)
    r = torch.arange(hq, device=device) * hk // hq  # (Hq,) key row of each query row
    c = torch.arange(wq, device=device) * wk // wq  # (Wq,)
    return (r[:, None] * wk + c[None, :]).flatten()  # (Nq,)


def offset_index(q_grid, k_grid=None, device=None) -> torch.Tensor:
    """For each query ``i`` and offset ``m`` the key ``j = cell(i) (+) m``: (Nq, Nk) long.

    Row ``i`` is a permutation of the keys, so ``A.gather(-1, idx)[..., i, m]`` is
    ``A[i, cell(i) (+) m]``.
    """
    q_grid = _grid('q_grid', q_grid)
    k_grid = q_grid if k_grid is None else _grid('k_grid', k_grid)
    hk, wk = k_grid
    cell = query_cells(q_grid, k_grid, device)  # (Nq,)
    mr = torch.arange(hk, device=device).repeat_interleave(wk)  # (Nk,) offset row
    mc = torch.arange(wk, device=device).repeat(hk)  # (Nk,) offset column
    r = (cell // wk)[:, None] + mr[None, :]  # (Nq, Nk)
    c = (cell % wk)[:, None] + mc[None, :]
    return (r % hk) * wk + (c % wk)  # (Nq, Nk)


def bccb_kernel(attn: torch.Tensor, q_grid, k_grid=None, chunk: int = 4096) -> torch.Tensor:
    """Kernel of the BCCB projection: ``p[m] = mean_i A[i, cell(i) (+) m]``.

    Args:
        attn (Tensor): (..., Nq, Nk) with Nq = Hq*Wq, Nk = Hk*Wk (row-major tokens).
        q_grid ((int, int)): (Hq, Wq). k_grid ((int, int), optional): (Hk, Wk);
            None: the query grid.
        chunk (int): queries gathered at a time (bounds the temporary memory).

    Returns:
        Tensor: (..., Hk, Wk) in float64, ``p[..., mr, mc]`` for the wrapped offset
        (mr, mc) (offset 0 at [0, 0]).
    """
    q_grid = _grid('q_grid', q_grid)
    k_grid = q_grid if k_grid is None else _grid('k_grid', k_grid)
    _check_attn(attn, q_grid, k_grid)
    idx = offset_index(q_grid, k_grid, attn.device)  # (Nq, Nk)
    lead = attn.shape[:-2]
    total = attn.new_zeros(*lead, attn.shape[-1], dtype=torch.float64)  # (..., Nk)
    for start in range(0, attn.shape[-2], chunk):
        a = attn[..., start : start + chunk, :]  # (..., n, Nk)
        i = idx[start : start + chunk].expand(*lead, -1, -1)
        total += a.gather(-1, i).to(torch.float64).sum(-2)
    return (total / attn.shape[-2]).view(*lead, *k_grid)


def bccb_expand(kernel: torch.Tensor, q_grid=None) -> torch.Tensor:
    """The matrix ``P[i, j] = p[(j - cell(i)) mod (Hk, Wk)]`` of a kernel.

    Args:
        kernel (Tensor): (..., Hk, Wk), offset 0 at [0, 0].
        q_grid ((int, int), optional): query grid; None: the kernel's grid (BCCB).

    Returns:
        Tensor: (..., Nq, Nk) in the kernel's dtype.
    """
    if not isinstance(kernel, torch.Tensor) or kernel.dim() < 2:
        raise ValueError(
            f'kernel must be a tensor (..., Hk, Wk), got {getattr(kernel, "shape", type(kernel))}'
        )
    k_grid = tuple(int(v) for v in kernel.shape[-2:])
    q_grid = k_grid if q_grid is None else _grid('q_grid', q_grid)
    idx = offset_index(q_grid, k_grid, kernel.device)  # (Nq, Nk): key of (i, m)
    # P[i, idx[i, m]] = p[m]: scatter each row's kernel to its keys
    flat = kernel.flatten(-2)  # (..., Nk)
    lead = flat.shape[:-1]
    out = flat.new_empty(*lead, idx.shape[0], idx.shape[1])
    return out.scatter_(-1, idx.expand(*lead, -1, -1), flat.unsqueeze(-2).expand_as(out))


def bccb_project(attn: torch.Tensor, q_grid, k_grid=None) -> torch.Tensor:
    """Nearest (Frobenius) matrix ``P(A)`` that depends only on the wrapped offset.

    (..., Nq, Nk) -> (..., Nq, Nk) in float64; see the module docstring.
    """
    return bccb_expand(bccb_kernel(attn, q_grid, k_grid), q_grid)


def bccb_distance(attn: torch.Tensor, q_grid, k_grid=None, reduce_dims=()) -> torch.Tensor:
    """Relative Frobenius distance ``||A - P(A)|| / ||A||`` (float64).

    Args:
        attn (Tensor): (..., Nq, Nk).
        q_grid, k_grid: as in :func:`bccb_kernel`.
        reduce_dims (Sequence[int]): leading dims whose matrices are taken together as
            one block-diagonal matrix (e.g. the windows of a Swin head): their squared
            distances and squared norms are summed before the ratio.

    Returns:
        Tensor: ``attn.shape[:-2]`` without ``reduce_dims``; 0 where ``||A|| = 0``.
    """
    p = bccb_kernel(attn, q_grid, k_grid)  # (..., Hk, Wk)
    nq = attn.shape[-2]
    norm2 = attn.to(torch.float64).square().sum((-2, -1))  # (...)
    proj2 = nq * p.square().sum((-2, -1))  # ||P(A)||^2
    diff2 = (norm2 - proj2).clamp_min(0)  # ||A - P(A)||^2 by orthogonality
    if reduce_dims:
        dims = tuple(reduce_dims)
        norm2, diff2 = norm2.sum(dims), diff2.sum(dims)
    return torch.where(norm2 > 0, (diff2 / norm2.clamp_min(1e-300)).sqrt(), torch.zeros_like(norm2))


def shuffle_tokens(attn: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """The shuffled-token baseline: rows and columns of ``A`` permuted at random.

    A square matrix gets the same permutation on queries and keys (the tokens are
    shuffled consistently: ``A'[i, j] = A[s(i), s(j)]``); a rectangular one (SRA:
    queries and reduced keys are different tokens) an independent permutation of each.
    Any BCCB structure is destroyed while the entries (and row sums) are kept.
    (..., Nq, Nk) -> (..., Nq, Nk).
    """
    nq, nk = attn.shape[-2:]
    pk = torch.randperm(nk, generator=generator).to(attn.device)
    pq = pk if nq == nk else torch.randperm(nq, generator=generator).to(attn.device)
    return attn.index_select(-2, pq).index_select(-1, pk)


def centre_kernel(kernel: torch.Tensor, boundary: str = 'circular') -> torch.Tensor:
    """Put offset 0 of a kernel at the centre for display.

    ``'circular'``: (..., H, W) indexed by the wrapped offset, rolled by (H//2, W//2)
    (offset 0 lands on [H//2, W//2], negative offsets above/left of it).
    ``'zero'``: (..., 2H-1, 2W-1) is already ordered by offset (offset 0 at the centre),
    returned unchanged.
    """
    if boundary == 'circular':
        h, w = kernel.shape[-2:]
        return torch.roll(kernel, (h // 2, w // 2), (-2, -1))
    if boundary == 'zero':
        return kernel
    raise ValueError(f"boundary must be 'circular' or 'zero', got {boundary!r}")


def gather_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each distribution along the last dim: (..., N) -> (...)."""
    w = weights.to(torch.float64)
    return -(w * torch.log(w.clamp_min(1e-300))).sum(-1)
