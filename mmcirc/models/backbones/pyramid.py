"""The pyramid skeleton shared by :class:`CAPVT` and :class:`CASwin`.

METHOD.md, "CA in pyramids": circulant (or core) attention replaces the attention of
the high-resolution stages of PVT and Swin; everything else of the pyramid stays as
it was. Hence one skeleton with a per-stage choice of attention:

* blocks: :class:`CirculantBlock` (the official CA block), :class:`CoreBlock` (core
  attention with cores in and out) and, unchanged and imported from mmdet, the
  original block of each family (``PVTEncoderLayer`` with spatial-reduction
  attention, ``SwinBlock`` with shifted windows);
* :class:`PyramidStage`: ``[patch_embed] -> [pos_embed] -> blocks -> [norm] ->
  [downsample]``, with a learnable core bank when its attention is ``'core'``;
* :class:`PyramidBackbone`: argument checking, stochastic depth, the forward loop,
  ``out_indices``, ``frozen_stages``, ``norm_eval``, ``with_cp``, ``init_weights`` and
  elastic core counts. The family subclasses (``ca_pvt.py``, ``ca_swin.py``) only say
  how a stage is laid out and what their original block is.
"""
import math
from numbers import Integral, Real
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.transformer import FFN, build_dropout
from mmdet.models.backbones.pvt import MixFFN
from mmdet.models.layers import nlc_to_nchw
from mmengine.model import BaseModule, ModuleList
from mmengine.model.weight_init import constant_init, normal_init, trunc_normal_, trunc_normal_init
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils.checkpoint import checkpoint

from mmcirc.ops.circulant import BOUNDARIES, CirculantAttention
from mmcirc.ops.core import CoreAttention, select_cores

__all__ = ['CORE_PRESETS', 'CirculantBlock', 'CoreBlock', 'PyramidStage', 'PyramidBackbone']

#: Deployment presets of the active core count C' (METHOD.md, section 2).
CORE_PRESETS: Dict[str, int] = {'mobile': 8, 'edge': 32, 'server': 64}
FFN_TYPES = ('ffn', 'mixffn')


# --------------------------------------------------------------------------- helpers
def _cpe(conv: nn.Conv2d, x: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
    """Depthwise 3x3 conv (conditional positional encoding) of tokens (B, N, C)."""
    return conv(nlc_to_nchw(x, hw_shape)).flatten(2).transpose(1, 2)


def _build_ffn(ffn_type: str, embed_dims: int, feedforward_channels: int, drop_rate: float,
               drop_path_rate: float, act_cfg: dict) -> nn.Module:
    """The MLP of a block, as the family writes it: mmcv ``FFN`` (Swin, keys
    ``ffn.layers.0.0`` / ``ffn.layers.1``) or mmdet's ``MixFFN`` without its depthwise
    conv (PVT, 1x1 convs, keys ``ffn.layers.0`` / ``ffn.layers.3``)."""
    dropout_layer = dict(type='DropPath', drop_prob=drop_path_rate)
    if ffn_type == 'ffn':
        return FFN(embed_dims=embed_dims, feedforward_channels=feedforward_channels, num_fcs=2,
                   ffn_drop=drop_rate, dropout_layer=dropout_layer, act_cfg=act_cfg, add_identity=True)
    if ffn_type == 'mixffn':
        return MixFFN(embed_dims=embed_dims, feedforward_channels=feedforward_channels, act_cfg=act_cfg,
                      ffn_drop=drop_rate, dropout_layer=dropout_layer, use_conv=False)
    raise ValueError(f'ffn_type must be one of {FFN_TYPES}, got {ffn_type!r}')


def _apply_ffn(ffn: nn.Module, x_norm: torch.Tensor, hw_shape, identity: torch.Tensor) -> torch.Tensor:
    """``identity + DropPath(MLP(x_norm))`` for either FFN flavour."""
    if isinstance(ffn, MixFFN):
        return ffn(x_norm, hw_shape, identity=identity)
    return ffn(x_norm, identity=identity)


def _stride_of(module: Optional[nn.Module]) -> int:
    """Downsampling factor of an mmcv ``PatchEmbed`` (conv ``projection``) or
    ``PatchMerging`` (``sampler`` unfold); 1 for None."""
    if module is None:
        return 1
    inner = getattr(module, 'projection', None) or getattr(module, 'sampler', None)
    stride = getattr(inner, 'stride', 1)
    return int(stride[0] if isinstance(stride, (tuple, list)) else stride)


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


# --------------------------------------------------------------------------- blocks
class CirculantBlock(BaseModule):
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

    Parameter names: ``cpe``, ``norm1``, ``attn.{gate.0,qkv,proj}``, ``norm2``, ``ffn.*``.
    """

    def __init__(self, embed_dims: int, feedforward_channels: int, num_heads: Optional[int] = None,
                 boundary: str = 'circular', scale='sqrt_n', drop_rate: float = 0.,
                 drop_path_rate: float = 0., ffn_type: str = 'ffn', act_cfg=dict(type='GELU'),
                 norm_cfg=dict(type='LN'), init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.cpe = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims, bias=True)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = CirculantAttention(embed_dims, num_heads=num_heads, boundary=boundary, scale=scale,
                                       proj_drop=drop_rate)
        self.drop_path = build_dropout(dict(type='DropPath', drop_prob=drop_path_rate))
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = _build_ffn(ffn_type, embed_dims, feedforward_channels, drop_rate, drop_path_rate, act_cfg)

    def forward(self, x: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
        """x (B, N, C) tokens of an H x W map, hw_shape (H, W); returns (B, N, C)."""
        x = x + _cpe(self.cpe, x, hw_shape)
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape))
        return _apply_ffn(self.ffn, self.norm2(x), hw_shape, identity=x)


class CoreBlock(BaseModule):
    """A core-attention block: patches talk only through the C' cores.

    ``[x = x + CPE(x)]``, ``y, cores = CoreAttention(LN(x), cores)``,
    ``x = x + DropPath(y)``, ``x = x + DropPath(MLP(LN(x)))``; the updated cores go on
    to the next block of the stage.

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

    def __init__(self, embed_dims: int, num_heads: int, feedforward_channels: int, qkv_bias: bool = True,
                 drop_rate: float = 0., attn_drop_rate: float = 0., drop_path_rate: float = 0.,
                 use_cpe: bool = True, chunk_size: Optional[int] = None, ffn_type: str = 'ffn',
                 act_cfg=dict(type='GELU'), norm_cfg=dict(type='LN'), init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if use_cpe:
            self.cpe = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims, bias=True)
        else:
            self.cpe = None
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = CoreAttention(embed_dims, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop_rate,
                                  proj_drop=drop_rate, chunk_size=chunk_size)
        self.drop_path = build_dropout(dict(type='DropPath', drop_prob=drop_path_rate))
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = _build_ffn(ffn_type, embed_dims, feedforward_channels, drop_rate, drop_path_rate, act_cfg)

    def forward(self, x: torch.Tensor, hw_shape: Sequence[int],
                cores: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """x (B, N, C), hw_shape (H, W), cores (B, C', C) -> (x (B, N, C), cores (B, C', C))."""
        if self.cpe is not None:
            x = x + _cpe(self.cpe, x, hw_shape)
        y, cores = self.attn(self.norm1(x), cores)
        x = x + self.drop_path(y)
        return _apply_ffn(self.ffn, self.norm2(x), hw_shape, identity=x), cores


# --------------------------------------------------------------------------- stage
class PyramidStage(BaseModule):
    """One pyramid stage: ``[patch_embed] -> [pos_embed] -> blocks -> [norm] -> [downsample]``.

    PVT embeds its patches at the start of each stage (``patch_embed``, ``pos_embed``,
    ``norm``); Swin merges patches at the end (``downsample``). Absent parts are None.
    A ``'core'`` stage owns a learnable bank ``cores`` (``num_cores_max`` x C, init std
    0.02) of which the first ``num_cores`` enter the first block; each block returns
    updated cores for the next one.

    Args:
        attention (str): the attention of the blocks (informative, and ``'core'``
            makes the bank).
        blocks (list[nn.Module]): blocks called as ``blk(x, hw_shape)`` or, for
            ``'core'``, ``blk(x, hw_shape, cores) -> (x, cores)``.
        embed_dims (int): channels of the blocks.
        patch_embed, pos_embed, norm, downsample (nn.Module, optional): see above.
        num_cores_max (int): bank size (``'core'`` only). num_cores (int): active C'.
        with_cp (bool): torch.utils.checkpoint each block (saves memory in training).

    ``forward(x, hw_shape) -> (x_next, hw_next, out, out_hw)``: the input of the next
    stage and this stage's output (before ``downsample``), tokens (B, N, C).
    """

    def __init__(self, attention: str, blocks: List[nn.Module], embed_dims: int,
                 patch_embed: Optional[nn.Module] = None, pos_embed: Optional[nn.Module] = None,
                 norm: Optional[nn.Module] = None, downsample: Optional[nn.Module] = None,
                 num_cores_max: int = 64, num_cores: int = 64, with_cp: bool = False, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.attention = attention
        self.embed_dims = embed_dims
        self.with_cp = with_cp
        self.patch_embed = patch_embed
        self.pos_embed = pos_embed
        self.blocks = ModuleList(blocks)
        self.norm = norm
        self.downsample = downsample
        if attention == 'core':
            self.cores = nn.Parameter(torch.zeros(num_cores_max, embed_dims))
            self.num_cores = num_cores
        else:
            self.cores = None
            self.num_cores = None

    def extra_repr(self) -> str:
        s = f'attention={self.attention!r}'
        if self.cores is not None:
            s += f', num_cores={self.num_cores}/{self.cores.shape[0]}'
        return s

    def init_weights(self):
        """Core bank ~ trunc normal, std 0.02 (a large init collapses the gather)."""
        if self.cores is not None and not self.is_init:
            trunc_normal_(self.cores, std=0.02)
        super().init_weights()

    def _call(self, block: nn.Module, *args):
        if self.with_cp and torch.is_grad_enabled() and args[0].requires_grad:
            return checkpoint(block, *args, use_reentrant=False)
        return block(*args)

    def forward(self, x: torch.Tensor, hw_shape: Optional[Sequence[int]]):
        """x: tokens (B, N, C) with ``hw_shape``, or an image/map (B, C, H, W) when the
        stage starts with ``patch_embed``. Returns (x_next, hw_next, out, out_hw)."""
        if self.patch_embed is not None:
            if x.dim() == 3:
                x = nlc_to_nchw(x, hw_shape)
            x, hw_shape = self.patch_embed(x)
        hw_shape = tuple(int(s) for s in hw_shape)
        if self.pos_embed is not None:
            x = self.pos_embed(x, hw_shape)
        if self.cores is None:
            for block in self.blocks:
                x = self._call(block, x, hw_shape)
        else:
            cores = select_cores(self.cores, self.num_cores, int(x.shape[0])).to(x.dtype)
            if not torch.is_grad_enabled():
                # a view of the bank made under no_grad still reports requires_grad
                # without a grad_fn, which trips torch's ModuleTracker (FlopCounterMode)
                cores = cores.detach()
            for block in self.blocks:
                x, cores = self._call(block, x, hw_shape, cores)
        if self.norm is not None:
            x = self.norm(x)
        out, out_hw = x, hw_shape
        if self.downsample is not None:
            x, hw_shape = self.downsample(x, hw_shape)
            hw_shape = tuple(int(s) for s in hw_shape)
        return x, hw_shape, out, out_hw


# --------------------------------------------------------------------------- backbone
class PyramidBackbone(BaseModule):
    """Family-independent part of the CA/Core pyramids (abstract; see CAPVT, CASwin).

    Subclasses set the class attributes below and build, in their ``__init__``, the
    stage list named ``stages_attr`` (and any stem) from what :meth:`_setup` parsed.

    Class attributes:
        arch_zoo (dict): named variants, each a dict of ``embed_dims``, ``depths`` and
            ``num_heads``.
        original_attention (str): the family's own attention (``'sra'``/``'window'``).
        stages_attr (str): attribute holding the stage ModuleList (mmdet's name).
        conv_init (str | None): ``'fan_out'`` to init convs as mmdet's PVT does.
    """

    arch_zoo: Dict[str, dict] = {}
    original_attention: str = ''
    stages_attr: str = 'stages'
    conv_init: Optional[str] = None
    #: Stages that take circulant/core attention in the paper's layout.
    num_replaced_stages: int = 2

    # ------------------------------------------------------------------ parsing
    @classmethod
    def attention_choices(cls) -> Tuple[str, ...]:
        return ('circulant', 'core', cls.original_attention)

    @classmethod
    def _parse_arch(cls, arch) -> dict:
        if isinstance(arch, str):
            if arch.lower() not in cls.arch_zoo:
                raise ValueError(f'{cls.__name__}: arch must be one of {tuple(cls.arch_zoo)} or a dict '
                                 f'with keys embed_dims, depths, num_heads; got {arch!r}')
            arch = cls.arch_zoo[arch.lower()]
        if not isinstance(arch, dict):
            raise ValueError(f'{cls.__name__}: arch must be a str in {tuple(cls.arch_zoo)} or a dict, '
                             f'got {type(arch).__name__}')
        keys = {'embed_dims', 'depths', 'num_heads'}
        if set(arch) != keys:
            raise ValueError(f'{cls.__name__}: an arch dict needs exactly the keys {sorted(keys)}, '
                             f'got {sorted(arch)}')
        depths, num_heads = tuple(arch['depths']), tuple(arch['num_heads'])
        embed_dims = cls._stage_widths(arch['embed_dims'], len(depths))
        for name, seq in (('depths', depths), ('num_heads', num_heads), ('embed_dims', embed_dims)):
            if not seq or not all(_is_int(v) and v >= 1 for v in seq):
                raise ValueError(f'{cls.__name__}: arch {name} must be positive ints, got {seq!r}')
        if not len(depths) == len(num_heads) == len(embed_dims):
            raise ValueError(f'{cls.__name__}: arch depths, num_heads and embed_dims must have one entry '
                             f'per stage, got lengths {len(depths)}, {len(num_heads)}, {len(embed_dims)}')
        return dict(embed_dims=tuple(int(v) for v in embed_dims), depths=tuple(int(v) for v in depths),
                    num_heads=tuple(int(v) for v in num_heads))

    @classmethod
    def _stage_widths(cls, embed_dims, num_stages: int) -> tuple:
        """Channels per stage from the arch's ``embed_dims`` (a sequence here)."""
        if _is_int(embed_dims):
            raise ValueError(f'{cls.__name__}: arch embed_dims must list one width per stage, '
                             f'got {embed_dims!r}')
        return tuple(embed_dims)

    @staticmethod
    def _per_stage(name: str, value, num_stages: int, check=None) -> tuple:
        """Broadcast a scalar to all stages, or check a sequence has one per stage."""
        if isinstance(value, (list, tuple)):
            if len(value) != num_stages:
                raise ValueError(f'{name} must have {num_stages} entries (one per stage), '
                                 f'got {len(value)}: {tuple(value)!r}')
            values = tuple(value)
        else:
            values = (value, ) * num_stages
        if check is not None:
            for i, v in enumerate(values):
                if not check(v):
                    raise ValueError(f'{name}[{i}] is invalid: {v!r}')
        return values

    def _parse_stage_attentions(self, attention, stage_attentions, num_stages: int) -> tuple:
        choices = self.attention_choices()
        if attention not in choices:
            raise ValueError(f'{type(self).__name__}: attention must be one of {choices}, got {attention!r}')
        if stage_attentions is None:
            k = self.num_replaced_stages
            return (attention, ) * min(k, num_stages) + (self.original_attention, ) * max(num_stages - k, 0)
        if isinstance(stage_attentions, str):
            stage_attentions = (stage_attentions, ) * num_stages
        stage_attentions = tuple(stage_attentions)
        if len(stage_attentions) != num_stages:
            raise ValueError(f'{type(self).__name__}: stage_attentions must have {num_stages} entries '
                             f'(one per stage), got {len(stage_attentions)}: {stage_attentions!r}')
        for i, kind in enumerate(stage_attentions):
            if kind not in choices:
                raise ValueError(f'{type(self).__name__}: stage_attentions[{i}] must be one of {choices}, '
                                 f'got {kind!r}')
        return stage_attentions

    @staticmethod
    def _parse_out_indices(out_indices, num_stages: int) -> tuple:
        if _is_int(out_indices):
            out_indices = (out_indices, )
        if not isinstance(out_indices, (list, tuple)) or not out_indices:
            raise ValueError(f'out_indices must be an int or a non-empty sequence of ints in '
                             f'[-{num_stages}, {num_stages - 1}], got {out_indices!r}')
        normalised = []
        for idx in out_indices:
            if not _is_int(idx) or not -num_stages <= idx < num_stages:
                raise ValueError(f'out_indices must be ints in [-{num_stages}, {num_stages - 1}] '
                                 f'(stages 0..{num_stages - 1}), got {tuple(out_indices)!r}')
            normalised.append(int(idx) % num_stages)
        return tuple(sorted(set(normalised)))

    @staticmethod
    def _parse_num_cores(num_cores, num_cores_max: int, name: str = 'num_cores') -> int:
        if isinstance(num_cores, str):
            if num_cores not in CORE_PRESETS:
                raise ValueError(f'{name} must be an int in [1, {num_cores_max}] or a preset in '
                                 f'{tuple(CORE_PRESETS)} {CORE_PRESETS}, got {num_cores!r}')
            num_cores = CORE_PRESETS[num_cores]
        if not _is_int(num_cores) or not 1 <= num_cores <= num_cores_max:
            raise ValueError(f'{name} must be an int in [1, num_cores_max={num_cores_max}] or a preset in '
                             f'{tuple(CORE_PRESETS)} {CORE_PRESETS}, got {num_cores!r}')
        return int(num_cores)

    def _setup(self, arch, attention, stage_attentions, out_indices, drop_path_rate, circulant_heads,
               boundary, scale, num_cores, num_cores_max, frozen_stages, norm_eval, with_cp):
        """Parse and check the common arguments (ValueError names the parameter)."""
        cls_name = type(self).__name__
        self.arch_settings = self._parse_arch(arch)
        self.embed_dims = self.arch_settings['embed_dims']
        self.depths = self.arch_settings['depths']
        self.num_heads = self.arch_settings['num_heads']
        self.num_stages = len(self.depths)
        self.num_features = list(self.embed_dims)
        self.stage_attentions = self._parse_stage_attentions(attention, stage_attentions, self.num_stages)
        self.out_indices = self._parse_out_indices(out_indices, self.num_stages)
        for i, (kind, dims, heads) in enumerate(zip(self.stage_attentions, self.embed_dims, self.num_heads)):
            if kind != 'circulant' and dims % heads:
                raise ValueError(f'{cls_name}: num_heads[{i}]={heads} must divide embed_dims[{i}]={dims} '
                                 f'(stage {i} uses {kind!r} attention)')
        if boundary not in BOUNDARIES:
            raise ValueError(f'{cls_name}: boundary must be one of {BOUNDARIES}, got {boundary!r}')
        if not ((isinstance(scale, str) and scale in ('sqrt_n', 'n')) or
                (isinstance(scale, Real) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0)):
            raise ValueError(f"{cls_name}: scale must be 'sqrt_n', 'n' or a positive float, got {scale!r}")
        self.boundary, self.scale = boundary, scale
        self.circulant_heads = self._per_stage('circulant_heads', circulant_heads, self.num_stages,
                                               lambda v: v is None or (_is_int(v) and v >= 1))
        for i, (kind, dims, heads) in enumerate(zip(self.stage_attentions, self.embed_dims,
                                                    self.circulant_heads)):
            if kind == 'circulant' and heads is not None and dims % heads:
                raise ValueError(f'{cls_name}: circulant_heads[{i}]={heads} must divide '
                                 f'embed_dims[{i}]={dims}')
        if not _is_int(num_cores_max) or num_cores_max < 1:
            raise ValueError(f'{cls_name}: num_cores_max must be a positive int, got {num_cores_max!r}')
        self.num_cores_max = int(num_cores_max)
        self._num_cores = self._parse_num_cores(num_cores_max if num_cores is None else num_cores,
                                                self.num_cores_max)
        if not (isinstance(drop_path_rate, Real) and 0 <= drop_path_rate < 1):
            raise ValueError(f'{cls_name}: drop_path_rate must be in [0, 1), got {drop_path_rate!r}')
        total = sum(self.depths)
        dpr = [drop_path_rate * k / max(total - 1, 1) for k in range(total)]  # linear over all blocks
        self.drop_path_rates = [dpr[sum(self.depths[:i]):sum(self.depths[:i + 1])]
                                for i in range(self.num_stages)]
        if not _is_int(frozen_stages) or not -1 <= frozen_stages <= self.num_stages:
            raise ValueError(f'{cls_name}: frozen_stages must be an int in [-1, {self.num_stages}], '
                             f'got {frozen_stages!r}')
        self.frozen_stages = int(frozen_stages)
        self.norm_eval = bool(norm_eval)
        self.with_cp = bool(with_cp)

    # ------------------------------------------------------------------ building
    def _circulant_block(self, i: int, j: int, mlp_ratio: float, ffn_type: str, common: dict) -> nn.Module:
        dims = self.embed_dims[i]
        return CirculantBlock(dims, int(mlp_ratio * dims), num_heads=self.circulant_heads[i],
                              boundary=self.boundary, scale=self.scale, drop_rate=common['drop_rate'],
                              drop_path_rate=self.drop_path_rates[i][j], ffn_type=ffn_type,
                              act_cfg=common['act_cfg'], norm_cfg=common['norm_cfg'])

    def _core_block(self, i: int, j: int, mlp_ratio: float, ffn_type: str, use_cpe: bool,
                    chunk_size: Optional[int], common: dict) -> nn.Module:
        dims = self.embed_dims[i]
        return CoreBlock(dims, self.num_heads[i], int(mlp_ratio * dims), qkv_bias=common['qkv_bias'],
                         drop_rate=common['drop_rate'], attn_drop_rate=common['attn_drop_rate'],
                         drop_path_rate=self.drop_path_rates[i][j], use_cpe=use_cpe, chunk_size=chunk_size,
                         ffn_type=ffn_type, act_cfg=common['act_cfg'], norm_cfg=common['norm_cfg'])

    def _stages(self) -> ModuleList:
        return getattr(self, self.stages_attr)

    def _stem(self, x: torch.Tensor):
        """Before the first stage: (x, hw_shape). Default: nothing (PVT)."""
        return x, None

    def _stem_modules(self) -> List[nn.Module]:
        """Modules frozen by ``frozen_stages >= 0`` (the first patch embedding)."""
        raise NotImplementedError

    def _stage_modules(self, i: int) -> List[nn.Module]:
        """Modules frozen with stage ``i`` (0-based) by ``frozen_stages > i``."""
        modules = [self._stages()[i]]
        norm = getattr(self, f'norm{i}', None)
        if norm is not None:
            modules.append(norm)
        return modules

    # ------------------------------------------------------------------ elastic cores
    @property
    def num_cores(self) -> int:
        """Active core count C' of the core stages."""
        return self._num_cores

    def set_num_cores(self, num_cores) -> None:
        """Set the active core count C' (int in [1, num_cores_max] or a preset name in
        ``CORE_PRESETS``) of every core stage; takes effect from the next forward."""
        self._num_cores = self._parse_num_cores(num_cores, self.num_cores_max)
        for stage in self._stages():
            if stage.cores is not None:
                stage.num_cores = self._num_cores

    # ------------------------------------------------------------------ mm contract
    def _freeze_stages(self) -> None:
        if self.frozen_stages >= 0:
            for m in self._stem_modules():
                m.eval()
                for param in m.parameters():
                    param.requires_grad = False
        for i in range(self.frozen_stages):
            for m in self._stage_modules(i):
                m.eval()
                for param in m.parameters():
                    param.requires_grad = False

    def train(self, mode: bool = True):
        """Set train/eval mode, keeping frozen stages (and, with ``norm_eval``, the
        normalisation layers) in eval mode."""
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)):
                    m.eval()
        return self

    def init_weights(self):
        """Default init (truncated normal linears, unit norms, std-0.02 core banks and
        position tables, PVT: fan-out convs), then mmengine's ``init_cfg`` handling, so
        ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix=...)`` loads on top."""
        if not self.is_init:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    trunc_normal_init(m, std=.02, bias=0.)
                elif isinstance(m, nn.LayerNorm):
                    constant_init(m, 1.0, bias=0.)
                elif isinstance(m, nn.Conv2d) and self.conv_init == 'fan_out':
                    fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                    normal_init(m, mean=0, std=math.sqrt(2.0 / fan_out), bias=0.)
        super().init_weights()

    @property
    def min_input_size(self) -> int:
        """The smallest H (and W) this backbone accepts.

        Patch embeddings and merges pad the bottom/right, so a stage at total stride s
        sees a ceil(H / s)-row map, and circulant, core and window attention take any
        map, down to 1 x 1. PVT's spatial-reduction attention does not: its keys come
        from a stride-r, kernel-r convolution (``attn.sr_ratio`` = r), which needs an
        r x r map, i.e. H >= s * (r - 1) + 1.
        """
        size, stride = 1, _stride_of(getattr(self, 'patch_embed', None))
        for stage in self._stages():
            stride *= _stride_of(stage.patch_embed)
            ratio = max((getattr(getattr(b, 'attn', None), 'sr_ratio', 1) for b in stage.blocks),
                        default=1)
            size = max(size, stride * (ratio - 1) + 1)
            stride *= _stride_of(stage.downsample)
        return size

    def _check_input_size(self, x: torch.Tensor) -> None:
        if torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export():
            return  # symbolic shapes: the check would specialise the graph
        h, w = int(x.shape[-2]), int(x.shape[-1])
        minimum = self.min_input_size
        if min(h, w) < minimum:
            raise ValueError(f'{type(self).__name__}: input size {h}x{w} is below the minimum '
                             f'{minimum}x{minimum} (spatial-reduction attention needs a map of '
                             'at least sr_ratio x sr_ratio in its stage)')

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x (B, in_channels, H, W), H and W >= :attr:`min_input_size`; returns one
        (B, C_i, H_i, W_i) map per index in ``out_indices`` (stage order)."""
        self._check_input_size(x)
        x, hw_shape = self._stem(x)
        outs = []
        for i, stage in enumerate(self._stages()):
            x, hw_shape, out, out_hw = stage(x, hw_shape)
            if i in self.out_indices:
                norm = getattr(self, f'norm{i}', None)
                if norm is not None:
                    out = norm(out)
                outs.append(nlc_to_nchw(out, out_hw).contiguous())
        return tuple(outs)
