"""Baseline attention operators the benchmarks and the complexity plot compare
circulant and core attention against, each on a token sequence x (B, N, C).

This file needs torch only; with mmengine installed, the three are also registered in
the MODELS registries (``dict(type='SDPASelfAttention', dim=64)``).
"""

import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

from mmcirc.ops.core import CoreAttention, check_positive, select_cores

__all__ = ['SDPASelfAttention', 'MHASelfAttention', 'CoreAttentionWithBank']


def _heads(dim, num_heads):
    check_positive('dim', dim)
    check_positive('num_heads', num_heads)
    if dim % num_heads:
        raise ValueError(f'num_heads must divide dim={dim}, got {num_heads}')


class SDPASelfAttention(nn.Module):
    """Global softmax self-attention: qkv projection, torch's SDPA, output projection
    (PVT stage 1 with one head is this, without the spatial reduction).

    Args:
        dim (int): channels C.
        num_heads (int): heads (each C / num_heads wide).

    ``forward(x)``: x (B, N, C) -> (B, N, C).
    """

    # mmcirc.analysis.probes: an attention layer for the FLOP counter, not captured
    attention_kind = 'sdpa'
    attention_form = None

    def __init__(self, dim, num_heads=1):
        super().__init__()
        _heads(dim, num_heads)
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        # (B, N, 3C) -> 3 x (B, heads, N, C / heads)
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v)  # (B, heads, N, C / heads)
        return self.proj(o.transpose(1, 2).reshape(b, n, c))


class MHASelfAttention(nn.Module):
    """``nn.MultiheadAttention`` self-attention (batch first, no weights returned).

    ``forward(x)``: x (B, N, C) -> (B, N, C).
    """

    def __init__(self, dim, num_heads=1):
        super().__init__()
        _heads(dim, num_heads)
        self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class CoreAttentionWithBank(nn.Module):
    """:class:`~mmcirc.ops.CoreAttention` with a learnable bank of ``bank_size`` cores,
    of which the first ``num_cores`` take part (elastic C', what a core block does).

    Args:
        dim (int): channels C.
        num_heads (int): heads of the core attention.
        num_cores (int): active cores C', 1 <= C' <= ``bank_size``.
        bank_size (int): cores in the bank (initialised N(0, 0.02^2)).

    ``forward(x)``: x (B, N, C) -> ``(y, cores)``: (B, N, C) and (B, C', C).
    """

    def __init__(self, dim, num_heads=1, num_cores=64, bank_size=64):
        super().__init__()
        check_positive('bank_size', bank_size)
        check_positive('num_cores', num_cores)
        if num_cores > bank_size:
            raise ValueError(f'num_cores must be in [1, {bank_size}] (bank_size), got {num_cores}')
        self.attn = CoreAttention(dim, num_heads)
        self.bank = nn.Parameter(torch.randn(bank_size, dim) * 0.02)
        self.num_cores = num_cores

    def forward(self, x):
        # int(): the FLOP tracer hands out sizes as 0-dim tensors
        return self.attn(x, select_cores(self.bank, self.num_cores, int(x.shape[0])))


if importlib.util.find_spec('mmengine') is not None:  # registration needs OpenMMLab
    from mmcirc.registry import register_model

    for _cls in (SDPASelfAttention, MHASelfAttention, CoreAttentionWithBank):
        register_model(_cls)
