"""``'window'``: mmdet's Swin block (shifted-window attention), unchanged."""

import math
from typing import Sequence

import torch
from mmdet.models.backbones.swin import ShiftWindowMSA, SwinBlock

from mmcirc.registry import register_model
from .pyramid_blocks import PyramidBlock

__all__ = ['WindowBlock']


def _mask_in_input_dtype(module, args, kwargs):
    """mmdet builds the shift mask in float32: in the windows' dtype, a bfloat16 /
    float16 model runs without autocast (the sum with the logits would otherwise make
    them float32, which ``attn @ v`` refuses)."""
    mask = kwargs.get('mask')
    if mask is not None and mask.dtype != args[0].dtype:
        kwargs = dict(kwargs, mask=mask.to(args[0].dtype))
    return args, kwargs


@register_model()
class WindowBlock(PyramidBlock, SwinBlock):
    """mmdet's ``SwinBlock`` (Swin's own block: the original of the ``'swin'``
    family), with the block declarations; same arguments, parameters and forward.
    In a backbone, ``window_size`` and ``qk_scale`` apply; every second block of a
    stage is shifted. With float16 / bfloat16 weights (set when they are cast) the shift
    mask is cast to the windows' dtype (:func:`_mask_in_input_dtype`)."""

    kind = 'window'
    fx_leaves = (ShiftWindowMSA,)  # pads and shifts by the map's size
    options = ('window_size', 'qk_scale')

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mask_hook = None
        self._cast_mask()

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._cast_mask()
        return out

    def _cast_mask(self) -> None:
        """Hook :func:`_mask_in_input_dtype` on the window attention while the weights
        are float16 / bfloat16; none in float32 / float64 (the mask's dtype adds up)."""
        low = self.norm1.weight.dtype in (torch.float16, torch.bfloat16)
        if low and self._mask_hook is None:
            self._mask_hook = self.attn.w_msa.register_forward_pre_hook(
                _mask_in_input_dtype, with_kwargs=True
            )
        elif not low and self._mask_hook is not None:
            self._mask_hook.remove()
            self._mask_hook = None

    @classmethod
    def block_args(cls, j: int) -> dict:
        """Every second block of a stage shifts its windows."""
        return dict(shift=j % 2 == 1)

    def attention_matrix(self, hw: Sequence[int]) -> dict:
        """Each query of the padded map attends to the window**2 keys of its window."""
        h, w = hw
        ws = self.attn.w_msa.window_size[0]  # (Wh, Ww), square
        n = math.ceil(h / ws) * ws * math.ceil(w / ws) * ws
        return dict(queries=n, keys=ws * ws, heads=self.attn.w_msa.num_heads)
