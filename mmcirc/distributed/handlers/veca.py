"""VECA's core-periphery attention on a row-banded token map (METHOD.md 3.2).

The :class:`~mmcirc.distributed.banded_map.BandedMap` handler of
:class:`~mmcirc.models.backbones.veca.CorePeripheryAttention` (:func:`core_periphery_banded`),
with the module's own projections and RoPE (its ``project``):

* patches see the cores only: local;
* cores see the C' cores and all N patches: per rank the scores s_r over its keys (the
  core keys on rank 0 only, so they count once), its max m_r, then with
  m = max_r m_r (``all_reduce(MAX)``) the sums l = sum_r sum e^(s_r - m) and
  o = sum_r e^(s_r - m) v_r (one ``all_reduce(SUM)``); cores' = o / l, the same on every
  rank.

Differentiable: the sum by a differentiable ``all_reduce`` (the max only shifts: no
gradient), which adds the ranks' parts of the gradient of the replicated cores.

Communication per layer (s bytes per element): s B heads C' (MAX) and
s B heads C' (1 + head_dim) (SUM), independent of the image size.

Importing this module registers the handler
(:func:`mmcirc.distributed.segmentor.model.load_operators` does).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mmcirc.models.backbones.veca import CorePeripheryAttention

from ..banded_map import BandedMap, refuse, register_operator
from ..comm import all_reduce_sum, group_rank_size

__all__ = ['core_periphery_banded']

_NAME = 'CorePeripheryAttention'


@register_operator(CorePeripheryAttention, prefix=True)
def core_periphery_banded(module: CorePeripheryAttention, x, cos, sin, num_cores: int):
    """x: BandedMap (B, C' + N, D), the C' cores its replicated prefix, then this rank's
    band of patches (local (B, C' + n_r, D)); cos / sin plain (B, C' + N, head_dim), cut
    to the cores and the band -> this rank's band of the module's output, same layout."""
    if not isinstance(x, BandedMap) or x.band_dim != 1 or x.prefix != num_cores:
        raise refuse(
            _NAME, f'takes tokens banded along dim 1 after the {num_cores} cores as prefix'
        )
    if isinstance(cos, BandedMap) or isinstance(sin, BandedMap):
        raise refuse(_NAME, 'takes plain cos / sin over every token')
    if cos.shape[1] != x.shape[1] or sin.shape[1] != x.shape[1]:
        raise refuse(_NAME, f'takes cos / sin of {x.shape[1]} tokens, got {cos.shape[1]}')
    if module.training and module.dropout > 0:
        raise refuse(_NAME, 'takes no attention dropout (call model.eval())')
    b, t, d = x.local.shape  # t = C' + n_r
    c = num_cores
    q, k, v = module.project(x.local, x.cut(cos, 1), x.cut(sin, 1))  # (B, h, C'+n_r, dh)
    rank, size = group_rank_size(x.group)
    keys, vals = (k, v) if rank == 0 else (k[:, :, c:], v[:, :, c:])  # (B, h, T_r, dh)
    s = (q[:, :, :c] @ keys.transpose(-1, -2)) * module.head_dim**-0.5  # (B, h, C', T_r)
    if s.shape[-1]:
        m = s.detach().amax(-1, keepdim=True)  # (B, h, C', 1); a shift: no gradient
    else:
        m = s.new_full(s.shape[:-1] + (1,), float('-inf'))
    if size > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=x.group)
    e = torch.exp(s - m)  # (B, h, C', T_r)
    acc = torch.cat([e.sum(-1, keepdim=True), e @ vals], dim=-1)  # (B, h, C', 1 + dh)
    acc = all_reduce_sum(acc, x.group)  # differentiable
    cores = acc[..., 1:] / acc[..., :1]  # (B, h, C', dh)
    qp, kc, vc = q[:, :, c:], k[:, :, :c], v[:, :, :c]  # (B, h, n_r | C', dh)
    patches = F.scaled_dot_product_attention(qp, kc, vc)  # (B, h, n_r, dh)
    y = torch.cat([cores, patches], dim=2).transpose(1, 2).reshape(b, t, d)  # (B, t, D)
    return x.like(module.out_drop(module.out_proj(y)))
