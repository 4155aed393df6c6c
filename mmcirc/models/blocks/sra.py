"""``'sra'``: mmdet's PVT v1 block (spatial-reduction attention), unchanged but for the
attention weights that mmdet drops: not averaged over the heads (the same output)."""

from typing import Sequence

from mmdet.models.backbones.pvt import PVTEncoderLayer, SpatialReductionAttention
from torch import nn

from mmcirc.registry import register_model
from .pyramid_blocks import PyramidBlock

__all__ = ['SRABlock']


def _per_head_weights(mha: nn.MultiheadAttention, args, kwargs):
    """Forward pre-hook of the SRA's ``nn.MultiheadAttention``: mmdet's
    ``SpatialReductionAttention`` keeps only its output (``[0]``), so its attention weights
    come per head (the softmax itself, (B, heads, N, N')), not averaged over the heads (a
    reduction of all the scores that mmdet never reads; under bf16 autocast it first
    copies them to float32). The output is the same, bitwise."""
    return args, {**kwargs, 'average_attn_weights': False}


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

    def min_grid(self) -> int:
        """Its keys come from a stride-r, kernel-r convolution (``attn.sr_ratio`` = r),
        which needs an r x r map."""
        return self.attn.sr_ratio

    def attention_matrix(self, hw: Sequence[int]) -> dict:
        """``nn.MultiheadAttention`` with ``need_weights``: every token queries the
        (h // sr) x (w // sr) reduced keys (all h x w keys when sr = 1)."""
        (h, w), sr = hw, self.attn.sr_ratio
        return dict(queries=h * w, keys=(h // sr) * (w // sr), heads=self.attn.attn.num_heads)
