"""``'sra'``: mmdet's PVT v1 block (spatial-reduction attention), unchanged but for the
attention weights that mmdet drops: not averaged over the heads (the same output)."""

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from mmdet.models.backbones.pvt import PVTEncoderLayer, SpatialReductionAttention
from torch import nn

from mmcirc.registry import register_model
from .probe import AttentionProbe, call_arg, register_attention_probe
from .pyramid_blocks import PyramidBlock

__all__ = ['SRABlock', 'SRAProbe', 'mha_weights']


def mha_weights(mha: nn.MultiheadAttention, query, key) -> torch.Tensor:
    """Per-head weights of a torch ``nn.MultiheadAttention`` (batch-first inputs
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
    q = F.linear(query, wq, bq).unflatten(-1, (h, c // h)).transpose(1, 2)  # (B, h, Lq, d)
    k = F.linear(key, wk, bk).unflatten(-1, (h, c // h)).transpose(1, 2)  # (B, h, Lk, d)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // h), dim=-1)


class SRAProbe(AttentionProbe):
    """Spatial-reduction attention: mmdet's ``SpatialReductionAttention`` (PVT v1/v2,
    the ``'sra'`` stages) and any module with an ``sr_ratio`` and an
    ``nn.MultiheadAttention`` ``attn`` (mmseg's SegFormer attention). Form
    ``'matrix'`` (B, heads, Nq, Nk): query grid = ``hw_shape``, key grid = the
    spatial-reduction conv's output."""

    kind = 'sra'
    form = 'matrix'

    def matches(self, m):
        return isinstance(m, SpatialReductionAttention) or (
            hasattr(m, 'sr_ratio') and isinstance(getattr(m, 'attn', None), nn.MultiheadAttention)
        )

    def weights(self, mod, args, kwargs, ctx):
        x, hw = call_arg(args, kwargs, 0, 'x'), call_arg(args, kwargs, 1, 'hw_shape')
        hw = tuple(int(v) for v in hw)
        b, n, c = x.shape
        kv, k_grid = x, hw
        if getattr(mod, 'sr_ratio', 1) > 1:
            kv = mod.sr(x.transpose(1, 2).reshape(b, c, *hw))  # (B, C, Hk, Wk)
            k_grid = tuple(int(v) for v in kv.shape[-2:])
            kv = mod.norm(kv.flatten(2).transpose(1, 2))  # (B, Nk, C)
        return dict(weights=mha_weights(mod.attn, x, kv), q_grid=hw, k_grid=k_grid)


def _per_head_weights(mha: nn.MultiheadAttention, args, kwargs):
    """Forward pre-hook of the SRA's ``nn.MultiheadAttention``: mmdet's
    ``SpatialReductionAttention`` keeps only its output (``[0]``), so its attention weights
    come per head (the softmax itself, (B, heads, N, N')), not averaged over the heads (a
    reduction of all the scores that mmdet never reads; under bf16 autocast it first
    copies them to float32). The output is the same, bitwise."""
    return args, {**kwargs, 'average_attn_weights': False}


register_attention_probe(SRAProbe())


@register_model()
class SRABlock(PyramidBlock, PVTEncoderLayer):
    """mmdet's ``PVTEncoderLayer`` (PVT's own block: the original of the ``'pvt'``
    family), with the block declarations; same arguments, parameters and forward (its
    attention weights, which mmdet drops, not averaged: :func:`_per_head_weights`).
    In a backbone, ``sr_ratios`` (per stage, as ``sr_ratio``) applies."""

    kind = 'sra'
    fx_leaves = (SpatialReductionAttention,)
    options = ('sr_ratios',)
    quadratic = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.attn.attn.register_forward_pre_hook(_per_head_weights, with_kwargs=True)

    def attention_matrix(self, hw: Sequence[int]) -> dict:
        """``nn.MultiheadAttention`` with ``need_weights``: every token queries the
        (h // sr) x (w // sr) reduced keys (all h x w keys when sr = 1)."""
        h, w = hw
        sr = int(getattr(self.attn, 'sr_ratio', 1))
        n = h * w
        return dict(
            queries=n, keys=(h // sr) * (w // sr) if sr > 1 else n, heads=self.attn.attn.num_heads
        )
