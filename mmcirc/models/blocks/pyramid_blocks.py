"""The blocks of the pyramids' replaced stages, what every pyramid block declares, and
the parts the blocks share.

A block is a module ``blk(x, hw_shape) -> x`` (tokens (B, N, C) of an H x W map) or,
when it ``carries_cores``, ``blk(x, hw_shape, cores) -> (x, cores)``; a family maps its
attention kinds to block classes in a plain dict. Every block declares, as class
attributes (:class:`PyramidBlock`):

* ``kind``: its name in a backbone's ``attention`` / ``stage_attentions``;
* ``carries_cores``: the stage owns a core bank whose cores go through the blocks;
* ``added_keys``: state-dict key prefixes (relative to the block) that the family's
  original block lacks, i.e. what a converted checkpoint leaves new;
* ``options``: the backbone-level options it reads (e.g. ``boundary``);
* ``quadratic``: its attention matrix grows with the square of the map area;
* ``variant_prefix``: the name prefix of a pyramid whose replaced stages are of this
  kind (``'ca'``: ``ca_pvt_s``, in config, checkpoint and timm names), if any;
* ``fx_leaves``: its module classes whose forward branches on sizes or makes them ints,
  which ``torch.fx`` records whole (mmcirc.timm);

and how it takes the backbone's options (:meth:`PyramidBlock.stage_args`), what varies
along a stage (:meth:`PyramidBlock.block_args`) and the smallest map it takes
(:meth:`PyramidBlock.min_grid`), so that the shared builder knows no kind by name.

The shared parts run on the tokens as they come, with the families' parameter names:
:class:`TokenCPE`, :class:`TokenFFN` (Swin's MLP) and :class:`TokenMixFFN` (PVT's),
made by :func:`build_ffn`.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.transformer import FFN, build_dropout
from mmdet.models.backbones.pvt import MixFFN
from mmengine.model import BaseModule

from mmcirc.ops.circulant import CirculantAttention
from mmcirc.ops.core import CoreAttention
from mmcirc.registry import register_model
from . import mlp_chunks

__all__ = [
    'PyramidBlock',
    'StageOptions',
    'FFN_TYPES',
    'TokenCPE',
    'TokenFFN',
    'TokenMixFFN',
    'build_ffn',
    'CirculantBlock',
    'CoreBlock',
]

FFN_TYPES = ('ffn', 'mixffn')


@dataclass(frozen=True)
class StageOptions:
    """What a pyramid offers the blocks of stage ``index`` (its options, checked): each
    block class takes its part (:meth:`PyramidBlock.stage_args`). ``owner`` names the
    backbone in errors; ``ffn_type`` is the family's MLP."""

    owner: str
    index: int
    embed_dims: int
    num_heads: int
    ffn_type: str
    circulant_heads: Optional[int]
    boundary: str
    scale: Union[str, float]
    qkv_bias: bool
    attn_drop_rate: float
    core_cpe: bool
    core_chunk_size: Optional[int]

    def dividing(self, name: str, heads: Optional[int], note: str = '') -> Optional[int]:
        """``heads`` (the option ``name`` of this stage) if it divides the width (or is None)."""
        i = self.index
        if heads is not None and self.embed_dims % heads:
            raise ValueError(
                f'{self.owner}: {name}[{i}]={heads} must divide embed_dims[{i}]='
                f'{self.embed_dims}{note}'
            )
        return heads


class PyramidBlock:
    """Mixin of the declarations above (see the module docstring)."""

    kind: str = ''
    carries_cores: bool = False
    added_keys: Tuple[str, ...] = ()
    options: Tuple[str, ...] = ()
    quadratic: bool = False
    variant_prefix: str = ''
    fx_leaves: tuple = ()

    @classmethod
    def stage_args(cls, stage: StageOptions) -> dict:
        """The arguments this block takes from its backbone in ``stage``, beside the MLP's
        that every kind takes: here the family's ``ffn_type``, once ``num_heads`` is found
        to divide the width. A family's own block gets its family's arguments instead."""
        note = f' (stage {stage.index} uses {cls.kind!r} attention)'
        stage.dividing('num_heads', stage.num_heads, note)
        return dict(ffn_type=stage.ffn_type)

    @classmethod
    def block_args(cls, j: int) -> dict:
        """The arguments of a stage's ``j``-th block of this kind that vary along the stage."""
        return {}

    def min_grid(self) -> int:
        """The smallest map (rows and columns) this block takes: 1."""
        return 1

    def added_state_keys(self) -> List[str]:
        """This block's state-dict keys that the family's original block lacks."""
        return [k for k in self.state_dict() if k.startswith(tuple(self.added_keys))]

    def attention_matrix(self, hw: Sequence[int]) -> Optional[dict]:
        """Size of the materialised attention matrix on an (h, w) map:
        ``dict(queries, keys, heads)``, or None when there is none."""
        return None


class TokenCPE(nn.Conv2d):
    """Depthwise 3x3 conv with bias (conditional positional encoding) of tokens
    (B, N, C) of an ``hw_shape`` map, run on their channels-last view: no layout copy
    either way (the conv keeps that memory format). Keys ``weight``, ``bias``."""

    def __init__(self, embed_dims: int):
        super().__init__(embed_dims, embed_dims, 3, padding=1, groups=embed_dims, bias=True)

    def forward(self, x: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
        b, _, c = x.shape
        m = x.reshape(b, hw_shape[0], hw_shape[1], c).permute(0, 3, 1, 2)  # (B, C, H, W) view
        return super().forward(m).permute(0, 2, 3, 1).reshape(b, -1, c)  # (B, N, C) view


class TokenFFN(FFN):
    """mmcv's ``FFN`` (Swin's MLP, keys ``layers.0.0`` / ``layers.1``), with its identity,
    over chunks of tokens in CPU inference (:mod:`.mlp_chunks`): the same result."""

    def forward(self, x: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
        """x (B, N, C) normalised tokens, identity (B, N, C) -> identity + MLP(x)."""
        if type(x.shape[1]) is int and x.shape[1] > mlp_chunks.FFN_CHUNK_TOKENS:
            if mlp_chunks.chunkable(self, x):
                return mlp_chunks.mlp_chunked(self, x, identity)
        return super().forward(x, identity=identity)


class TokenMixFFN(MixFFN):
    """mmdet's ``MixFFN`` without its depthwise conv (PVT's MLP, keys ``layers.0`` /
    ``layers.3``), run on the tokens: each 1x1 conv as the GEMM ``F.linear`` with the
    conv's own weight viewed (out, in), the activation and dropouts elementwise, so no
    (B, C, H, W) layout is made; over chunks of tokens in CPU inference."""

    def forward(self, x: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
        """x (B, N, C) normalised tokens, identity (B, N, C) -> identity + MLP(x)."""
        if type(x.shape[1]) is int and x.shape[1] > mlp_chunks.FFN_CHUNK_TOKENS:
            if mlp_chunks.chunkable(self, x):
                return mlp_chunks.mlp_chunked(self, x, identity)
        for layer in self.layers:  # 1x1 conv, act, dropout, 1x1 conv, dropout
            if isinstance(layer, nn.Conv2d):
                x = F.linear(x, layer.weight.flatten(1), layer.bias)  # (B, N, C_out)
            else:
                x = layer(x)
        return identity + self.dropout_layer(x)


def build_ffn(
    ffn_type: str,
    embed_dims: int,
    feedforward_channels: int,
    drop_rate: float,
    drop_path_rate: float,
    act_cfg: dict,
) -> nn.Module:
    """The MLP of a block as the family writes it: ``'ffn'`` (Swin) a :class:`TokenFFN`,
    ``'mixffn'`` (PVT) a :class:`TokenMixFFN`; called ``ffn(x_norm, identity)``."""
    dropout_layer = dict(type='DropPath', drop_prob=drop_path_rate)
    if ffn_type == 'ffn':
        return TokenFFN(
            embed_dims=embed_dims,
            feedforward_channels=feedforward_channels,
            num_fcs=2,
            ffn_drop=drop_rate,
            dropout_layer=dropout_layer,
            act_cfg=act_cfg,
            add_identity=True,
        )
    if ffn_type == 'mixffn':
        return TokenMixFFN(
            embed_dims=embed_dims,
            feedforward_channels=feedforward_channels,
            act_cfg=act_cfg,
            ffn_drop=drop_rate,
            dropout_layer=dropout_layer,
            use_conv=False,
        )
    raise ValueError(f'ffn_type must be one of {FFN_TYPES}, got {ffn_type!r}')


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
        kernel (str, optional): the attention's core, ``'torch'`` or ``'triton'`` (see
            :class:`~mmcirc.ops.circulant.CirculantAttention`; a block config's option).

    Parameter names: ``cpe``, ``norm1``, ``attn.{gate.0,qkv,proj}``, ``norm2``, ``ffn.*``.
    """

    kind = 'circulant'
    fx_leaves = (CirculantAttention,)
    added_keys = ('cpe.', 'attn.')
    options = ('circulant_heads', 'boundary', 'scale')
    variant_prefix = 'ca'

    @classmethod
    def stage_args(cls, stage: StageOptions) -> dict:
        """Its own heads (``circulant_heads``, None: d = 1), ``boundary``, ``scale``."""
        heads = stage.dividing('circulant_heads', stage.circulant_heads)
        return dict(
            ffn_type=stage.ffn_type, num_heads=heads, boundary=stage.boundary, scale=stage.scale
        )

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
        kernel: Optional[str] = None,
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.cpe = TokenCPE(embed_dims)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = CirculantAttention(
            embed_dims,
            num_heads=num_heads,
            boundary=boundary,
            scale=scale,
            proj_drop=drop_rate,
            kernel=kernel,
        )
        self.drop_path = build_dropout(dict(type='DropPath', drop_prob=drop_path_rate))
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = build_ffn(
            ffn_type, embed_dims, feedforward_channels, drop_rate, drop_path_rate, act_cfg
        )

    def forward(self, x: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
        """x (B, N, C) tokens of an H x W map, hw_shape (H, W); returns (B, N, C)."""
        x = x + self.cpe(x, hw_shape)
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape))
        return self.ffn(self.norm2(x), identity=x)


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

    Parameter names: ``[cpe]``, ``norm1``, ``attn.*`` (see CoreAttention), ``norm2``, ``ffn.*``.
    """

    kind = 'core'
    fx_leaves = (CoreAttention,)
    carries_cores = True
    added_keys = ('cpe.', 'attn.')
    options = ('num_cores', 'num_cores_max', 'core_cpe', 'core_chunk_size')
    variant_prefix = 'core'

    @classmethod
    def stage_args(cls, stage: StageOptions) -> dict:
        """The stage's heads, ``qkv_bias``, ``attn_drop_rate``, ``core_cpe`` (as
        ``use_cpe``) and ``core_chunk_size`` (as ``chunk_size``)."""
        return dict(
            super().stage_args(stage),
            num_heads=stage.num_heads,
            qkv_bias=stage.qkv_bias,
            attn_drop_rate=stage.attn_drop_rate,
            use_cpe=stage.core_cpe,
            chunk_size=stage.core_chunk_size,
        )

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
        self.cpe = TokenCPE(embed_dims) if use_cpe else None
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

    def forward(
        self, x: torch.Tensor, hw_shape: Sequence[int], cores: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """x (B, N, C), hw_shape (H, W), cores (B, C', C) -> (x (B, N, C), cores (B, C', C))."""
        if self.cpe is not None:
            x = x + self.cpe(x, hw_shape)
        y, cores = self.attn(self.norm1(x), cores)
        x = x + self.drop_path(y)
        return self.ffn(self.norm2(x), identity=x), cores
