"""``'circulant'``: the official circulant-attention block (CA-DeiT), for any H x W map."""

from typing import Optional, Sequence

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.transformer import build_dropout
from mmengine.model import BaseModule

from mmcirc.ops.circulant import CirculantAttention, attention_kernel
from mmcirc.registry import register_model
from .base import PyramidBlock, apply_ffn, build_ffn, cpe
from .probe import AttentionProbe, call_arg

__all__ = ['CirculantBlock', 'CirculantProbe']


class CirculantProbe(AttentionProbe):
    """:class:`~mmcirc.ops.circulant.CirculantAttention` (any block): the per-head kernel
    ``p = softmax(a)`` over the offsets, ``a[m] = s sum_i q_i . k_{i (+) m}``, form
    ``'kernel'`` (B, heads, H, W) by wrapped offset (``'zero'``: (B, heads, 2H-1, 2W-1)
    ordered by offset, ``m + (H-1, W-1)``), with its ``boundary``."""

    kind = 'circulant'
    form = 'kernel'

    def matches(self, module):
        return isinstance(module, CirculantAttention)

    def weights(self, mod, args, kwargs, ctx):
        x, hw = call_arg(args, kwargs, 0, 'x'), call_arg(args, kwargs, 1, 'hw_shape')
        h, w = (int(v) for v in hw)
        p = attention_kernel(mod, x, (h, w))  # (B, heads, *grid), the operator's own body
        return dict(weights=p, q_grid=(h, w), k_grid=(h, w), boundary=mod.boundary)


@register_model()
class CirculantBlock(PyramidBlock, BaseModule):
    """The official circulant-attention block (CA-DeiT), for any H x W map.

    ``x = x + CPE(x)`` (3x3 depthwise conv, zero padded, with bias), then
    ``x = x + DropPath(CA(LN(x)))`` and ``x = x + DropPath(MLP(LN(x)))``.

    Args:
        embed_dims (int): channels C.
        feedforward_channels (int): hidden width of the MLP.
        num_heads (int, optional): circulant heads; None = one head per channel (d=1).
        boundary (str): ``'circular'`` or ``'zero'`` (see :mod:`mmcirc.ops.circulant`).
        scale (str | float): ``'sqrt_n'``, ``'n'`` or a positive float.
        drop_rate (float): dropout after the attention projection and in the MLP.
        drop_path_rate (float): stochastic depth of both residual branches.
        ffn_type (str): ``'ffn'`` (mmcv FFN, Swin) or ``'mixffn'`` (mmdet MixFFN, PVT).
        act_cfg (dict): MLP activation. norm_cfg (dict): the two norms.

    Parameter names: ``cpe``, ``norm1``, ``attn.{gate.0,qkv,proj}``, ``norm2``, ``ffn.*``;
    new relative to PVT's / Swin's block: ``cpe`` and ``attn``. In a backbone, the
    options ``circulant_heads`` (as ``num_heads``), ``boundary`` and ``scale`` apply.
    """

    kind = 'circulant'
    attention_probes = (CirculantProbe(),)
    fx_leaves = (CirculantAttention,)
    added_keys = ('cpe.', 'attn.')
    options = ('circulant_heads', 'boundary', 'scale')
    uses_num_heads = False

    def __init__(
        self,
        embed_dims: int,
        feedforward_channels: int,
        num_heads: Optional[int] = None,
        boundary: str = 'circular',
        scale='sqrt_n',
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        ffn_type: str = 'ffn',
        act_cfg=dict(type='GELU'),
        norm_cfg=dict(type='LN'),
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.cpe = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims, bias=True)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = CirculantAttention(
            embed_dims, num_heads=num_heads, boundary=boundary, scale=scale, proj_drop=drop_rate
        )
        self.drop_path = build_dropout(dict(type='DropPath', drop_prob=drop_path_rate))
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = build_ffn(
            ffn_type, embed_dims, feedforward_channels, drop_rate, drop_path_rate, act_cfg
        )

    @classmethod
    def stage_kwargs(cls, ctx: dict) -> dict:
        keys = (
            'embed_dims',
            'feedforward_channels',
            'boundary',
            'scale',
            'drop_rate',
            'drop_path_rate',
            'ffn_type',
            'act_cfg',
            'norm_cfg',
        )
        return dict({k: ctx[k] for k in keys}, num_heads=ctx['circulant_heads'])

    @classmethod
    def check_stage(cls, owner: str, i: int, ctx: dict) -> None:
        dims, heads = ctx['embed_dims'], ctx['circulant_heads']
        if heads is not None and dims % heads:
            raise ValueError(
                f'{owner}: circulant_heads[{i}]={heads} must divide embed_dims[{i}]={dims}'
            )

    def forward(self, x: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
        """x (B, N, C) tokens of an H x W map, hw_shape (H, W); returns (B, N, C)."""
        x = x + cpe(self.cpe, x, hw_shape)
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape))
        return apply_ffn(self.ffn, self.norm2(x), hw_shape, identity=x)
