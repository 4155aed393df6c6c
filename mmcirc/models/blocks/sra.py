"""``'sra'``: mmdet's PVT v1 block (spatial-reduction attention), unchanged."""

from typing import Sequence

from mmdet.models.backbones.pvt import PVTEncoderLayer

from mmcirc.registry import register_model
from .base import PyramidBlock

__all__ = ['SRABlock']


@register_model()
class SRABlock(PyramidBlock, PVTEncoderLayer):
    """mmdet's ``PVTEncoderLayer`` (PVT's own block: the original of the ``'pvt'``
    family), with the block declarations; same arguments, parameters and forward.
    In a backbone, ``sr_ratios`` (per stage, as ``sr_ratio``) applies."""

    kind = 'sra'
    families = ('pvt',)
    options = ('sr_ratios',)
    quadratic = True

    @classmethod
    def stage_kwargs(cls, ctx: dict) -> dict:
        keys = (
            'embed_dims',
            'num_heads',
            'feedforward_channels',
            'drop_rate',
            'attn_drop_rate',
            'drop_path_rate',
            'qkv_bias',
            'act_cfg',
            'norm_cfg',
            'sr_ratio',
        )
        return {k: ctx[k] for k in keys}

    def attention_matrix(self, hw: Sequence[int]) -> dict:
        """``nn.MultiheadAttention`` with ``need_weights``: every token queries the
        (h // sr) x (w // sr) reduced keys (all h x w keys when sr = 1)."""
        h, w = hw
        sr = int(getattr(self.attn, 'sr_ratio', 1))
        n = h * w
        return dict(
            queries=n, keys=(h // sr) * (w // sr) if sr > 1 else n, heads=self.attn.attn.num_heads
        )
