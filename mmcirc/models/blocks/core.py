"""``'core'``: a core-attention block (patches talk only through the C' cores)."""

from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.transformer import build_dropout
from mmengine.model import BaseModule

from mmcirc.ops.core import CoreAttention
from mmcirc.registry import register_model
from .base import PyramidBlock, apply_ffn, build_ffn, cpe
from .probe import AttentionProbe, call_arg

__all__ = ['CoreBlock', 'CoreProbe']


class CoreProbe(AttentionProbe):
    """:class:`~mmcirc.ops.core.CoreAttention`: the gather weights of each core over the
    patches ``softmax((c W_qc)_h (x W_kp)_h^T / sqrt(d))``, form ``'gather'``
    (B, heads, C', N); the patch grid is the enclosing block's ``hw_shape``."""

    kind = 'core'
    form = 'gather'

    def matches(self, module):
        return isinstance(module, CoreAttention)

    def weights(self, mod, args, kwargs, ctx):
        x, cores = call_arg(args, kwargs, 0, 'x'), call_arg(args, kwargs, 1, 'cores')
        q = mod.split_heads(mod.q_core(cores)) * mod.scale  # (B, h, C', d)
        k = mod.split_heads(mod.k_patch(x))  # (B, h, N, d)
        gather = torch.softmax(q @ k.transpose(-1, -2), dim=-1)  # (B, h, C', N)
        return dict(weights=gather, q_grid=None, k_grid=None)


@register_model()
class CoreBlock(PyramidBlock, BaseModule):
    """A core-attention block: patches talk only through the C' cores.

    ``[x = x + CPE(x)]``, ``y, cores = CoreAttention(LN(x), cores)``,
    ``x = x + DropPath(y)``, ``x = x + DropPath(MLP(LN(x)))``; the updated cores go on
    to the next block of the stage (``carries_cores``: the stage owns the bank).

    Args:
        embed_dims (int): channels C (of patches and cores).
        num_heads (int): heads of the gather and broadcast MHAs.
        feedforward_channels (int): hidden width of the MLP.
        qkv_bias (bool): bias of the query/value projections.
        drop_rate, attn_drop_rate, drop_path_rate (float): dropouts / stochastic depth.
        use_cpe (bool): add the 3x3 depthwise CPE first (Swin: on, PVT has absolute
            position embeddings: off).
        chunk_size (int, optional): patches per chunk of the streaming gather.
        ffn_type (str): ``'ffn'`` (Swin) or ``'mixffn'`` (PVT).
        act_cfg, norm_cfg (dict): MLP activation and norms.

    Parameter names: ``[cpe]``, ``norm1``, ``attn.*`` (see CoreAttention), ``norm2``, ``ffn.*``;
    new relative to PVT's / Swin's block: ``cpe`` and ``attn`` (and the stage's ``cores``).
    In a backbone, the options ``num_cores``, ``num_cores_max``, ``core_cpe`` (as
    ``use_cpe``) and ``core_chunk_size`` (as ``chunk_size``) apply.
    """

    kind = 'core'
    attention_probes = (CoreProbe(),)
    fx_leaves = (CoreAttention,)
    carries_cores = True
    added_keys = ('cpe.', 'attn.')
    options = ('num_cores', 'num_cores_max', 'core_cpe', 'core_chunk_size')

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        feedforward_channels: int,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        use_cpe: bool = True,
        chunk_size: Optional[int] = None,
        ffn_type: str = 'ffn',
        act_cfg=dict(type='GELU'),
        norm_cfg=dict(type='LN'),
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        if use_cpe:
            self.cpe = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims, bias=True)
        else:
            self.cpe = None
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = CoreAttention(
            embed_dims,
            num_heads,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop_rate,
            proj_drop=drop_rate,
            chunk_size=chunk_size,
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
            'num_heads',
            'feedforward_channels',
            'qkv_bias',
            'drop_rate',
            'attn_drop_rate',
            'drop_path_rate',
            'ffn_type',
            'act_cfg',
            'norm_cfg',
        )
        return dict(
            {k: ctx[k] for k in keys}, use_cpe=ctx['core_cpe'], chunk_size=ctx['core_chunk_size']
        )

    def forward(
        self, x: torch.Tensor, hw_shape: Sequence[int], cores: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """x (B, N, C), hw_shape (H, W), cores (B, C', C) -> (x (B, N, C), cores (B, C', C))."""
        if self.cpe is not None:
            x = x + cpe(self.cpe, x, hw_shape)
        y, cores = self.attn(self.norm1(x), cores)
        x = x + self.drop_path(y)
        return apply_ffn(self.ffn, self.norm2(x), hw_shape, identity=x), cores
