"""``'window'``: mmdet's Swin block (shifted-window attention), unchanged."""

import math
from typing import Sequence

from mmdet.models.backbones.swin import SwinBlock

from mmcirc.registry import register_model
from .base import PyramidBlock

__all__ = ['WindowBlock']


@register_model()
class WindowBlock(PyramidBlock, SwinBlock):
    """mmdet's ``SwinBlock`` (Swin's own block: the original of the ``'swin'``
    family), with the block declarations; same arguments, parameters and forward.
    In a backbone, ``window_size`` and ``qk_scale`` apply; every second block of a
    stage is shifted."""

    kind = 'window'
    families = ('swin',)
    options = ('window_size', 'qk_scale')

    @classmethod
    def stage_kwargs(cls, ctx: dict) -> dict:
        keys = (
            'embed_dims',
            'num_heads',
            'feedforward_channels',
            'window_size',
            'qkv_bias',
            'qk_scale',
            'drop_rate',
            'attn_drop_rate',
            'drop_path_rate',
            'act_cfg',
            'norm_cfg',
        )
        return dict({k: ctx[k] for k in keys}, shift=ctx['block_index'] % 2 == 1, with_cp=False)

    def attention_matrix(self, hw: Sequence[int]) -> dict:
        """Each query of the padded map attends to the window**2 keys of its window."""
        h, w = hw
        ws = self.attn.w_msa.window_size
        ws = ws[0] if isinstance(ws, (tuple, list)) else ws
        n = math.ceil(h / ws) * ws * math.ceil(w / ws) * ws
        return dict(queries=n, keys=ws * ws, heads=self.attn.w_msa.num_heads)
