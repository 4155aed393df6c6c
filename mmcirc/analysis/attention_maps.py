"""What an attention learned: BCCB projection of attention matrices and hook-based
capture of the matrices (or kernels, or gather weights) a model really uses.

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

**Capture.** :class:`AttentionCapture` registers forward hooks (no edit of any
library) and, inside the hook, recomputes the attention from the module's inputs and
its own weights: ``softmax(q k^T * scale [+ bias + mask])``. Recognised layers:

* ``'sra'``: mmdet's ``SpatialReductionAttention`` (PVT v1/v2, mmcirc's ``'sra'``
  stages) and every mmcv ``MultiheadAttention`` with an ``sr_ratio`` (mmseg's
  SegFormer attention); weights ``(B, heads, Nq, Nk)``, query grid = ``hw_shape``,
  key grid = the spatial-reduction conv's output.
* ``'window'``: Swin's ``WindowMSA`` (mmdet, mmseg, mmpretrain; mmcirc's ``'window'``
  stages), with relative position bias and shift mask; ``(B*windows, heads, N, N)``
  on the window grid.
* ``'vit'``: plain self-attention of a ViT/DeiT (mmpretrain's ``MultiheadAttention``
  with a fused ``qkv``; timm's ``Attention``); class/register tokens (the leading
  ``N - H*W`` tokens) are dropped, the grid is the last patch embedding's output.
* ``'circulant'``: :class:`mmcirc.ops.circulant.CirculantAttention`; the per-head
  kernel ``p = softmax(a)`` (``A[i, j] = p[j (-) i]``), ``(B, heads, H, W)`` indexed by
  the wrapped offset (``'zero'`` boundary: ``(B, heads, 2H-1, 2W-1)`` ordered by offset,
  ``m + (H-1, W-1)``).
* ``'core'``: :class:`mmcirc.ops.core.CoreAttention`; the gather weights of each core
  over the patches ``softmax((c W_qc)_h (x W_kp)_h^T / sqrt(d))``, ``(B, heads, C', N)``,
  every row summing to 1 over the patches.

The file depends on torch only; mmdet/mmpretrain/timm classes are recognised lazily
(by import when installed, else by their attributes).
"""

import functools
import importlib
import math
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    'KINDS',
    'AttentionRecord',
    'AttentionCapture',
    'find_attention_layers',
    'query_cells',
    'offset_index',
    'bccb_kernel',
    'bccb_expand',
    'bccb_project',
    'bccb_distance',
    'shuffle_tokens',
    'centre_kernel',
    'circulant_scale',
    'gather_entropy',
]

#: Kinds of attention layers the capture recognises (see the module docstring).
KINDS = ('sra', 'window', 'vit', 'circulant', 'core')
#: Kinds whose weights are an attention matrix between two grids (BCCB-scorable).
DENSE_KINDS = ('sra', 'window', 'vit')


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


# --------------------------------------------------------------------------- recomputation
def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, C) -> (B, heads, L, C // heads)."""
    b, n, c = t.shape
    return t.view(b, n, heads, c // heads).transpose(1, 2)


def _torch_mha_weights(mha: nn.MultiheadAttention, query, key) -> torch.Tensor:
    """Per-head weights of a torch ``nn.MultiheadAttention`` (batch first inputs
    (B, Lq, C) and (B, Lk, C)): softmax(q k^T / sqrt(head_dim)), (B, heads, Lq, Lk)."""
    if mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError('nn.MultiheadAttention with bias_k/add_zero_attn is not supported')
    c, h = mha.embed_dim, mha.num_heads
    bias = mha.in_proj_bias
    if mha._qkv_same_embed_dim:
        wq, wk = mha.in_proj_weight[:c], mha.in_proj_weight[c : 2 * c]
    else:
        wq, wk = mha.q_proj_weight, mha.k_proj_weight
    bq, bk = (None, None) if bias is None else (bias[:c], bias[c : 2 * c])
    q = _heads(F.linear(query, wq, bq), h)  # (B, h, Lq, d)
    k = _heads(F.linear(key, wk, bk), h)  # (B, h, Lk, d)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // h), dim=-1)


def _arg(args, kwargs, index, name, default=None):
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _sra(mod, args, kwargs):
    """SRA: x (B, N, C) tokens of hw_shape; keys from the sr conv + norm."""
    x, hw = _arg(args, kwargs, 0, 'x'), _arg(args, kwargs, 1, 'hw_shape')
    hw = tuple(int(v) for v in hw)
    b, n, c = x.shape
    kv, k_grid = x, hw
    if getattr(mod, 'sr_ratio', 1) > 1:
        kv = mod.sr(x.transpose(1, 2).reshape(b, c, *hw))  # (B, C, Hk, Wk)
        k_grid = tuple(int(v) for v in kv.shape[-2:])
        kv = mod.norm(kv.flatten(2).transpose(1, 2))  # (B, Nk, C)
    return _torch_mha_weights(mod.attn, x, kv), hw, k_grid


def _window(mod, args, kwargs):
    """Swin W-MSA on windows x (B*nW, N, C) with an optional shift mask (nW, N, N)."""
    x, mask = _arg(args, kwargs, 0, 'x'), _arg(args, kwargs, 1, 'mask')
    bw, n, c = x.shape
    h = mod.num_heads
    qkv = mod.qkv(x).reshape(bw, n, 3, h, c // h).permute(2, 0, 3, 1, 4)
    q, k = qkv[0] * mod.scale, qkv[1]  # (B*nW, h, N, d)
    attn = q @ k.transpose(-2, -1)  # (B*nW, h, N, N)
    bias = mod.relative_position_bias_table[mod.relative_position_index.view(-1)]
    attn = attn + bias.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)
    if mask is not None:
        nw = mask.shape[0]
        attn = (attn.view(bw // nw, nw, h, n, n) + mask[None, :, None]).view(bw, h, n, n)
    ws = mod.window_size
    ws = (ws, ws) if isinstance(ws, int) else tuple(int(v) for v in ws)
    return torch.softmax(attn, dim=-1), ws, ws


def _vit(mod, args, kwargs, grid):
    """Plain self-attention x (B, N, C) with a fused qkv (mmpretrain / timm)."""
    x = _arg(args, kwargs, 0, 'x')
    b, n, c = x.shape
    h = mod.num_heads
    qkv = mod.qkv(x).reshape(b, n, 3, h, -1).permute(2, 0, 3, 1, 4)
    q, k = qkv[0], qkv[1]  # (B, h, N, d)
    for norm_name, t in (('q_norm', 'q'), ('k_norm', 'k')):  # timm's optional qk norm
        norm = getattr(mod, norm_name, None)
        if norm is not None and not isinstance(norm, nn.Identity):
            if t == 'q':
                q = norm(q)
            else:
                k = norm(k)
    sdpa = getattr(mod, 'scaled_dot_product_attention', None)
    if isinstance(sdpa, functools.partial) and sdpa.keywords.get('scale'):
        scale = 1.0 / sdpa.keywords['scale']  # mmpretrain's qk_scale path divides by it
    else:
        scale = getattr(mod, 'scale', None) or q.shape[-1] ** -0.5
    attn = (q * scale) @ k.transpose(-2, -1)  # (B, h, N, N)
    mask = _arg(args, kwargs, 1, 'attn_mask')  # timm
    if mask is not None:
        attn = attn.masked_fill(~mask, float('-inf')) if mask.dtype == torch.bool else attn + mask
    attn = torch.softmax(attn, dim=-1)
    if grid is None:
        raise ValueError(
            f'{type(mod).__name__}: no patch grid seen before this attention '
            f'(N={n}); the model needs a patch embedding module'
        )
    extra = n - grid[0] * grid[1]
    if extra < 0:
        raise ValueError(f'{type(mod).__name__}: {n} tokens but a {grid[0]}x{grid[1]} patch grid')
    return attn[..., extra:, extra:], grid, grid


def circulant_scale(scale, n: int, d: int) -> float:
    """The circulant attention scale s (METHOD.md, 'Scale'): ``'sqrt_n'`` ->
    1/sqrt(N d), ``'n'`` -> 1/(N sqrt(d)), a float -> itself."""
    if scale == 'sqrt_n':
        return 1.0 / math.sqrt(n * d)
    if scale == 'n':
        return 1.0 / (n * math.sqrt(d))
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0:
        return float(scale)
    raise ValueError(f"scale must be 'sqrt_n', 'n' or a positive float, got {scale!r}")


def _circulant(mod, args, kwargs):
    """CirculantAttention: p = softmax over offsets of a[m] = s sum_i q_i . k_{i(+)m}."""
    x, hw = _arg(args, kwargs, 0, 'x'), _arg(args, kwargs, 1, 'hw_shape')
    h, w = (int(v) for v in hw)
    b, n, c = x.shape
    heads = mod.num_heads
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32  # as the operator
    bias = None if mod.qkv.bias is None else mod.qkv.bias[: 2 * c].to(cdt)
    qk = F.linear(x.to(cdt), mod.qkv.weight[: 2 * c].to(cdt), bias)  # (B, N, 2C)
    q, k = (
        qk.transpose(1, 2).reshape(b, 2, heads, c // heads, h, w).unbind(1)
    )  # (B, heads, d, H, W)
    grid = (h, w) if mod.boundary == 'circular' else (2 * h - 1, 2 * w - 1)
    # cross-correlation a[m] = sum_i q[i] k[i + m] on `grid` (zero padded: no wrap)
    spec = (torch.fft.rfft2(q, s=grid).conj() * torch.fft.rfft2(k, s=grid)).sum(2)
    a = torch.fft.irfft2(spec, s=grid) * circulant_scale(
        mod.scale, n, c // heads
    )  # (B, heads, *grid)
    if mod.boundary == 'zero':  # index m (m < 0 at P + m) -> ordered by offset m + (H-1, W-1)
        a = torch.roll(a, (h - 1, w - 1), (-2, -1))
    p = torch.softmax(a.flatten(2), dim=-1).view_as(a)
    return p, (h, w), (h, w)


def _core(mod, args, kwargs):
    """CoreAttention gather: cores (B, C', C) query the patches x (B, N, C)."""
    x, cores = _arg(args, kwargs, 0, 'x'), _arg(args, kwargs, 1, 'cores')
    q = _heads(mod.q_core(cores), mod.num_heads) * mod.scale  # (B, h, C', d)
    k = _heads(mod.k_patch(x), mod.num_heads)  # (B, h, N, d)
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1), None, None  # (B, h, C', N)


# --------------------------------------------------------------------------- recognition
def _lazy_classes(path: str, names: Sequence[str]) -> tuple:
    """Classes ``names`` of module ``path`` if its library is already imported (a model
    built from them has imported it); never imports a library itself."""
    if path.split('.')[0] not in sys.modules:
        return ()
    try:
        module = importlib.import_module(path)
    except Exception:  # noqa: BLE001  (broken install: recognise by attributes)
        return ()
    return tuple(getattr(module, n) for n in names if hasattr(module, n))


def _is_sra(m: nn.Module) -> bool:
    cls = _lazy_classes('mmdet.models.backbones.pvt', ['SpatialReductionAttention'])
    if cls and isinstance(m, cls):
        return True
    return hasattr(m, 'sr_ratio') and isinstance(getattr(m, 'attn', None), nn.MultiheadAttention)


def _is_window(m: nn.Module) -> bool:
    cls = _lazy_classes('mmdet.models.backbones.swin', ['WindowMSA'])
    if cls and isinstance(m, cls):
        return True
    return (
        type(m).__name__ == 'WindowMSA'
        and isinstance(getattr(m, 'qkv', None), nn.Linear)
        and hasattr(m, 'relative_position_bias_table')
        and hasattr(m, 'relative_position_index')
        and not hasattr(m, 'logit_scale')
    )


def _is_vit(m: nn.Module) -> bool:
    cls = _lazy_classes('mmpretrain.models.utils.attention', ['MultiheadAttention'])
    cls += _lazy_classes('timm.layers', ['Attention'])
    if cls and type(m) in cls:  # exact classes: subclasses may change the math
        return True
    return False


def _is_patch_embed(m: nn.Module) -> bool:
    return 'PatchEmbed' in type(m).__name__


def _patch_grid(m: nn.Module, inputs, output) -> Optional[Tuple[int, int]]:
    """Token grid produced by a patch embedding (mmcv/mmpretrain: (x, hw); timm: x)."""
    if (
        isinstance(output, (tuple, list))
        and len(output) == 2
        and isinstance(output[1], (tuple, list))
    ):
        return tuple(int(v) for v in output[1])
    if isinstance(output, torch.Tensor) and output.dim() == 4:  # timm NHWC output
        return int(output.shape[1]), int(output.shape[2])
    x = inputs[0] if inputs else None
    if isinstance(x, torch.Tensor) and x.dim() == 4 and hasattr(m, 'dynamic_feat_size'):
        return tuple(int(v) for v in m.dynamic_feat_size(tuple(x.shape[-2:])))
    grid = getattr(m, 'grid_size', None)
    return tuple(int(v) for v in grid) if grid is not None else None


def _kind(m: nn.Module) -> Optional[str]:
    from mmcirc.ops.circulant import CirculantAttention
    from mmcirc.ops.core import CoreAttention

    if isinstance(m, CirculantAttention):
        return 'circulant'
    if isinstance(m, CoreAttention):
        return 'core'
    if _is_sra(m):
        return 'sra'
    if _is_window(m):
        return 'window'
    if _is_vit(m):
        return 'vit'
    return None


def find_attention_layers(
    model: nn.Module, kinds: Sequence[str] = KINDS
) -> List[Tuple[str, str, nn.Module]]:
    """``[(name, kind, module)]`` of the recognised attention layers, in model order."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f'kinds must be a subset of {KINDS}, got {tuple(kinds)!r}')
    out = []
    for name, m in model.named_modules():
        kind = _kind(m)
        if kind is not None and kind in kinds:
            out.append((name, kind, m))
    return out


# --------------------------------------------------------------------------- capture
@dataclass
class AttentionRecord:
    """One call of one attention layer.

    ``weights`` (detached, float32 unless the model runs in float64):

    * dense kinds (``'sra'``, ``'window'``, ``'vit'``): the attention matrix
      (B', heads, Nq, Nk) between ``q_grid`` and ``k_grid`` (B' = B * windows for
      ``'window'``);
    * ``'circulant'``: the kernel p (B, heads, H, W) (``boundary='zero'``:
      (B, heads, 2H-1, 2W-1), ordered by offset); ``q_grid = k_grid`` = (H, W);
    * ``'core'``: the gather weights (B, heads, C', N); the patch grid in ``q_grid``
      when a surrounding block passed ``hw_shape`` (else None).
    """

    name: str
    kind: str
    weights: torch.Tensor
    q_grid: Optional[Tuple[int, int]]
    k_grid: Optional[Tuple[int, int]]
    call: int = 0
    extra: Dict[str, object] = field(default_factory=dict)


class AttentionCapture:
    """Context manager that records the attention of every recognised layer.

    Example::

        with AttentionCapture(model, kinds=('sra', 'window')) as cap:
            model.backbone(img)
        for rec in cap.records: ...

    Args:
        model (nn.Module): any model; layers are found by :func:`find_attention_layers`.
        kinds (Sequence[str]): which kinds to capture (default: all).
        callback (callable, optional): ``callback(record)`` after each capture (e.g. to
            reduce a large matrix at once); its return value replaces the record in
            :attr:`records` (return None to keep nothing).
    """

    def __init__(
        self,
        model: nn.Module,
        kinds: Sequence[str] = KINDS,
        callback: Optional[Callable[[AttentionRecord], Optional[AttentionRecord]]] = None,
    ):
        self.model = model
        self.layers = find_attention_layers(model, kinds)
        self.callback = callback
        self.records: List[AttentionRecord] = []
        self._handles = []
        self._grid = None  # last patch-embedding grid (ViT)
        self._hw = {}  # core layers: hw_shape of the enclosing block call
        self._calls = {}

    @property
    def kinds_found(self) -> Tuple[str, ...]:
        return tuple(sorted({k for _, k, _ in self.layers}))

    def __enter__(self):
        for name, m in self.model.named_modules():
            if _is_patch_embed(m):
                self._handles.append(m.register_forward_hook(self._patch_hook))
        for name, kind, m in self.layers:
            self._handles.append(
                m.register_forward_hook(self._make_hook(name, kind), with_kwargs=True)
            )
            if kind == 'core':
                self._hook_core_parent(name, m)
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def _patch_hook(self, m, inputs, output):
        grid = _patch_grid(m, inputs, output)
        if grid is not None:
            self._grid = grid

    def _hook_core_parent(self, name, m):
        """Record hw_shape of the block that calls a core layer (``blk(x, hw, cores)``)."""
        parent_name = name.rsplit('.', 1)[0] if '.' in name else ''
        parent = self.model.get_submodule(parent_name) if parent_name else None
        if parent is None:
            return

        def pre(_, args, kwargs):
            hw = _arg(args, kwargs, 1, 'hw_shape')
            if isinstance(hw, (tuple, list)) and len(hw) == 2:
                self._hw[name] = tuple(int(v) for v in hw)

        self._handles.append(parent.register_forward_pre_hook(pre, with_kwargs=True))

    def _make_hook(self, name, kind):
        def hook(m, args, kwargs, output):
            with torch.no_grad():
                if kind == 'sra':
                    w, qg, kg = _sra(m, args, kwargs)
                elif kind == 'window':
                    w, qg, kg = _window(m, args, kwargs)
                elif kind == 'vit':
                    w, qg, kg = _vit(m, args, kwargs, self._grid)
                elif kind == 'circulant':
                    w, qg, kg = _circulant(m, args, kwargs)
                else:
                    w, qg, kg = _core(m, args, kwargs)
                    qg = kg = self._hw.get(name)
            call = self._calls.get(name, 0)
            self._calls[name] = call + 1
            rec = AttentionRecord(name, kind, w.detach(), qg, kg, call)
            if kind == 'circulant':
                rec.extra['boundary'] = m.boundary
            if self.callback is not None:
                rec = self.callback(rec)
            if rec is not None:
                self.records.append(rec)

        return hook
