"""The pyramid skeleton shared by :class:`CAPVT` and :class:`CASwin`.

METHOD.md, "CA in pyramids": circulant (or core) attention replaces the attention of
the high-resolution stages of PVT and Swin; everything else of the pyramid stays as
it was. Hence one skeleton with a per-stage choice of attention:

* blocks: registered modules, one per attention kind (:mod:`mmcirc.models.blocks`):
  ``CirculantBlock`` (the official CA block), ``CoreBlock`` (core attention with
  cores in and out) and, unchanged from mmdet, the original block of each family
  (``SRABlock`` = ``PVTEncoderLayer``, ``WindowBlock`` = ``SwinBlock``). A stage's
  blocks come from a block config (``block_cfgs``) or the short form
  ``attention`` / ``stage_attentions`` (kind -> registered block); which kinds a
  family takes is read from the registry;
* :class:`PyramidStage`: ``[patch_embed] -> [pos_embed] -> blocks -> [norm] ->
  [downsample]``, with a learnable core bank when its blocks carry cores;
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
from mmdet.models.layers import nlc_to_nchw
from mmengine.model import BaseModule, ModuleList
from mmengine.model.weight_init import constant_init, normal_init, trunc_normal_, trunc_normal_init
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils.checkpoint import checkpoint

from mmcirc.ops.circulant import BOUNDARIES
from mmcirc.ops.core import select_cores
from ..blocks import CirculantBlock, CoreBlock, block_class, block_classes

__all__ = [
    'CORE_PRESETS',
    'CirculantBlock',
    'CoreBlock',
    'PyramidStage',
    'PyramidBackbone',
    'registered_pyramids',
]

#: Deployment presets of the active core count C' (METHOD.md, section 2).
CORE_PRESETS: Dict[str, int] = {'mobile': 8, 'edge': 32, 'server': 64}


# --------------------------------------------------------------------------- helpers
def _size(s):
    """``int(s)``, except a symbolic size (``torch.export`` with dynamic shapes), which
    stays symbolic so that one exported graph serves every input size."""
    return s if isinstance(s, torch.SymInt) else int(s)


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


# --------------------------------------------------------------------------- stage
class PyramidStage(BaseModule):
    """One pyramid stage: ``[patch_embed] -> [pos_embed] -> blocks -> [norm] -> [downsample]``.

    PVT embeds its patches at the start of each stage (``patch_embed``, ``pos_embed``,
    ``norm``); Swin merges patches at the end (``downsample``). Absent parts are None.
    A ``'core'`` stage owns a learnable bank ``cores`` (``num_cores_max`` x C, init std
    0.02) of which the first ``num_cores`` enter the first block; each block returns
    updated cores for the next one.

    Args:
        attention (str): the attention kind of the blocks (public: ``stage.attention``).
        blocks (list[nn.Module]): blocks called as ``blk(x, hw_shape)`` or, when they
            carry cores, ``blk(x, hw_shape, cores) -> (x, cores)``.
        embed_dims (int): channels of the blocks.
        patch_embed, pos_embed, norm, downsample (nn.Module, optional): see above.
        num_cores_max (int): bank size (core-carrying blocks only). num_cores (int): active C'.
        with_cp (bool): torch.utils.checkpoint each block (saves memory in training).
        carries_cores (bool, optional): whether the stage owns a core bank; None: when
            its blocks declare ``carries_cores``.

    ``forward(x, hw_shape) -> (x_next, hw_next, out, out_hw)``: the input of the next
    stage and this stage's output (before ``downsample``), tokens (B, N, C).
    """

    def __init__(
        self,
        attention: str,
        blocks: List[nn.Module],
        embed_dims: int,
        patch_embed: Optional[nn.Module] = None,
        pos_embed: Optional[nn.Module] = None,
        norm: Optional[nn.Module] = None,
        downsample: Optional[nn.Module] = None,
        num_cores_max: int = 64,
        num_cores: int = 64,
        with_cp: bool = False,
        carries_cores: Optional[bool] = None,
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.attention = attention
        self.embed_dims = embed_dims
        self.with_cp = with_cp
        self.patch_embed = patch_embed
        self.pos_embed = pos_embed
        self.blocks = ModuleList(blocks)
        self.norm = norm
        self.downsample = downsample
        if carries_cores is None:
            carries_cores = any(getattr(b, 'carries_cores', False) for b in blocks)
        if carries_cores:
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
        hw_shape = tuple(_size(s) for s in hw_shape)
        if self.pos_embed is not None:
            x = self.pos_embed(x, hw_shape)
        if self.cores is None:
            for block in self.blocks:
                x = self._call(block, x, hw_shape)
        else:
            cores = (
                select_cores(self.cores, self.num_cores)
                .unsqueeze(0)
                .expand(x.shape[0], -1, -1)
                .to(x.dtype)
            )  # (B, C', C); B may be symbolic (export)
            for block in self.blocks:
                x, cores = self._call(block, x, hw_shape, cores)
        if self.norm is not None:
            x = self.norm(x)
        out, out_hw = x, hw_shape
        if self.downsample is not None:
            x, hw_shape = self.downsample(x, hw_shape)
            hw_shape = tuple(_size(s) for s in hw_shape)
        return x, hw_shape, out, out_hw


# --------------------------------------------------------------------------- backbone
def registered_pyramids() -> Dict[str, List[type]]:
    """``{family: [classes]}`` of the registered :class:`PyramidBackbone` subclasses
    (registration order: the family's base class, e.g. ``CAPVT``, comes first)."""
    import inspect

    from mmcirc.registry import model_registries

    out: Dict[str, List[type]] = {}
    for cls in list(model_registries()[0].module_dict.values()):
        if inspect.isclass(cls) and issubclass(cls, PyramidBackbone) and cls.family:
            out.setdefault(cls.family, []).append(cls)
    return out


class PyramidBackbone(BaseModule):
    """Family-independent part of the CA/Core pyramids (abstract; see CAPVT, CASwin).

    Subclasses set the class attributes below and build, in their ``__init__``, the
    stage list named ``stages_attr`` (and any stem) from what :meth:`_setup` parsed,
    each stage's blocks with :meth:`_build_blocks`. The stages are public as
    :attr:`stages` (whatever attribute holds them), each with its ``attention`` kind.

    Class attributes:
        family (str): the family name the blocks declare they fit (``'pvt'``, ``'swin'``).
        arch_zoo (dict): named variants, each a dict of ``embed_dims``, ``depths`` and
            ``num_heads``.
        original_attention (str): the kind of the family's own block (``'sra'``/``'window'``).
        default_attention (str): ``attention`` when none is given.
        stages_attr (str): attribute holding the stage ModuleList (mmdet's name).
        conv_init (str | None): ``'fan_out'`` to init convs as mmdet's PVT does.

    Per-stage blocks: ``block_cfgs`` (a dict for every stage, or one dict / None per
    stage, as mmcv's ``attn_cfgs``) names a registered block with ``type`` and adds or
    overrides its arguments, e.g. ``[dict(type='CirculantBlock', boundary='zero'),
    None, None, None]``; without ``type``, the block of the stage's kind from
    ``attention`` / ``stage_attentions`` (the short form) gets the options.
    """

    family: str = ''
    arch_zoo: Dict[str, dict] = {}
    original_attention: str = ''
    default_attention: str = 'circulant'
    stages_attr: str = 'stages'
    conv_init: Optional[str] = None
    #: Stages that take circulant/core attention in the paper's layout.
    num_replaced_stages: int = 2

    # ------------------------------------------------------------------ parsing
    @classmethod
    def attention_choices(cls) -> Tuple[str, ...]:
        """The attention kinds this family takes: the registered blocks that fit it."""
        return tuple(block_classes(cls.family))

    @classmethod
    def _parse_arch(cls, arch) -> dict:
        if isinstance(arch, str):
            if arch.lower() not in cls.arch_zoo:
                raise ValueError(
                    f'{cls.__name__}: arch must be one of {tuple(cls.arch_zoo)} or a dict '
                    f'with keys embed_dims, depths, num_heads; got {arch!r}'
                )
            arch = cls.arch_zoo[arch.lower()]
        if not isinstance(arch, dict):
            raise ValueError(
                f'{cls.__name__}: arch must be a str in {tuple(cls.arch_zoo)} or a dict, '
                f'got {type(arch).__name__}'
            )
        keys = {'embed_dims', 'depths', 'num_heads'}
        if set(arch) != keys:
            raise ValueError(
                f'{cls.__name__}: an arch dict needs exactly the keys {sorted(keys)}, '
                f'got {sorted(arch)}'
            )
        depths, num_heads = tuple(arch['depths']), tuple(arch['num_heads'])
        embed_dims = cls._stage_widths(arch['embed_dims'], len(depths))
        for name, seq in (('depths', depths), ('num_heads', num_heads), ('embed_dims', embed_dims)):
            if not seq or not all(_is_int(v) and v >= 1 for v in seq):
                raise ValueError(f'{cls.__name__}: arch {name} must be positive ints, got {seq!r}')
        if not len(depths) == len(num_heads) == len(embed_dims):
            raise ValueError(
                f'{cls.__name__}: arch depths, num_heads and embed_dims must have one entry '
                f'per stage, got lengths {len(depths)}, {len(num_heads)}, {len(embed_dims)}'
            )
        return dict(
            embed_dims=tuple(int(v) for v in embed_dims),
            depths=tuple(int(v) for v in depths),
            num_heads=tuple(int(v) for v in num_heads),
        )

    @classmethod
    def _stage_widths(cls, embed_dims, num_stages: int) -> tuple:
        """Channels per stage from the arch's ``embed_dims`` (a sequence here)."""
        if _is_int(embed_dims):
            raise ValueError(
                f'{cls.__name__}: arch embed_dims must list one width per stage, got {embed_dims!r}'
            )
        return tuple(embed_dims)

    @staticmethod
    def _per_stage(name: str, value, num_stages: int, check=None) -> tuple:
        """Broadcast a scalar to all stages, or check a sequence has one per stage."""
        if isinstance(value, (list, tuple)):
            if len(value) != num_stages:
                raise ValueError(
                    f'{name} must have {num_stages} entries (one per stage), '
                    f'got {len(value)}: {tuple(value)!r}'
                )
            values = tuple(value)
        else:
            values = (value,) * num_stages
        if check is not None:
            for i, v in enumerate(values):
                if not check(v):
                    raise ValueError(f'{name}[{i}] is invalid: {v!r}')
        return values

    @classmethod
    def configured_stage_attentions(
        cls, attention=None, stage_attentions=None, block_cfgs=None, arch='tiny'
    ) -> Tuple[str, ...]:
        """The per-stage attention kinds a backbone built with these arguments has
        (checked as the constructor checks them), without building it."""
        num_stages = len(cls._parse_arch(arch)['depths'])
        return tuple(
            b.kind
            for b, _ in cls._parse_blocks(attention, stage_attentions, block_cfgs, num_stages)
        )

    @classmethod
    def _parse_blocks(cls, attention, stage_attentions, block_cfgs, num_stages: int) -> list:
        """[(block class, block options)] per stage from the short form and ``block_cfgs``."""
        name = cls.__name__
        kinds_of = block_classes(cls.family)
        choices = tuple(kinds_of)
        attention = cls.default_attention if attention is None else attention
        if attention not in choices:
            raise ValueError(f'{name}: attention must be one of {choices}, got {attention!r}')
        if stage_attentions is None:
            k = cls.num_replaced_stages
            kinds = (attention,) * min(k, num_stages) + (cls.original_attention,) * max(
                num_stages - k, 0
            )
        else:
            if isinstance(stage_attentions, str):
                stage_attentions = (stage_attentions,) * num_stages
            kinds = tuple(stage_attentions)
            if len(kinds) != num_stages:
                raise ValueError(
                    f'{name}: stage_attentions must have {num_stages} entries '
                    f'(one per stage), got {len(kinds)}: {kinds!r}'
                )
            for i, kind in enumerate(kinds):
                if kind not in choices:
                    raise ValueError(
                        f'{name}: stage_attentions[{i}] must be one of {choices}, got {kind!r}'
                    )
        if block_cfgs is None or isinstance(block_cfgs, dict):
            cfgs = (block_cfgs,) * num_stages
        elif isinstance(block_cfgs, (list, tuple)) and len(block_cfgs) == num_stages:
            cfgs = tuple(block_cfgs)
        else:
            raise ValueError(
                f'{name}: block_cfgs must be a dict or a list of {num_stages} dicts / None '
                f'(one per stage), got {block_cfgs!r}'
            )
        out = []
        for i, (kind, cfg) in enumerate(zip(kinds, cfgs)):
            if cfg is not None and not isinstance(cfg, dict):
                raise ValueError(f'{name}: block_cfgs[{i}] must be a dict or None, got {cfg!r}')
            options = dict(cfg or {})
            btype = options.pop('type', None)
            if btype is None:
                block = kinds_of[kind]
            else:
                try:
                    block = block_class(btype, cls.family)
                except ValueError as err:
                    raise ValueError(f'{name}: block_cfgs[{i}]: {err}') from None
                if stage_attentions is not None and block.kind != kind:
                    raise ValueError(
                        f'{name}: block_cfgs[{i}] type {btype!r} is {block.kind!r} attention '
                        f'but stage_attentions[{i}] is {kind!r}'
                    )
            out.append((block, options))
        return out

    @staticmethod
    def _parse_out_indices(out_indices, num_stages: int) -> tuple:
        if _is_int(out_indices):
            out_indices = (out_indices,)
        if not isinstance(out_indices, (list, tuple)) or not out_indices:
            raise ValueError(
                f'out_indices must be an int or a non-empty sequence of ints in '
                f'[-{num_stages}, {num_stages - 1}], got {out_indices!r}'
            )
        normalised = []
        for idx in out_indices:
            if not _is_int(idx) or not -num_stages <= idx < num_stages:
                raise ValueError(
                    f'out_indices must be ints in [-{num_stages}, {num_stages - 1}] '
                    f'(stages 0..{num_stages - 1}), got {tuple(out_indices)!r}'
                )
            normalised.append(int(idx) % num_stages)
        return tuple(sorted(set(normalised)))

    @staticmethod
    def _parse_num_cores(num_cores, num_cores_max: int, name: str = 'num_cores') -> int:
        if isinstance(num_cores, str):
            if num_cores not in CORE_PRESETS:
                raise ValueError(
                    f'{name} must be an int in [1, {num_cores_max}] or a preset in '
                    f'{tuple(CORE_PRESETS)} {CORE_PRESETS}, got {num_cores!r}'
                )
            num_cores = CORE_PRESETS[num_cores]
        if not _is_int(num_cores) or not 1 <= num_cores <= num_cores_max:
            raise ValueError(
                f'{name} must be an int in [1, num_cores_max={num_cores_max}] or a preset in '
                f'{tuple(CORE_PRESETS)} {CORE_PRESETS}, got {num_cores!r}'
            )
        return int(num_cores)

    def _setup(
        self,
        arch,
        attention,
        stage_attentions,
        out_indices,
        drop_path_rate,
        circulant_heads,
        boundary,
        scale,
        num_cores,
        num_cores_max,
        frozen_stages,
        norm_eval,
        with_cp,
        block_cfgs=None,
    ):
        """Parse and check the common arguments (ValueError names the parameter)."""
        cls_name = type(self).__name__
        self.arch_settings = self._parse_arch(arch)
        self.embed_dims = self.arch_settings['embed_dims']
        self.depths = self.arch_settings['depths']
        self.num_heads = self.arch_settings['num_heads']
        self.num_stages = len(self.depths)
        self.num_features = list(self.embed_dims)
        blocks = self._parse_blocks(attention, stage_attentions, block_cfgs, self.num_stages)
        self.block_types = tuple(b for b, _ in blocks)
        self.block_options = tuple(o for _, o in blocks)
        self.stage_attentions = tuple(b.kind for b in self.block_types)
        self.out_indices = self._parse_out_indices(out_indices, self.num_stages)
        if boundary not in BOUNDARIES:
            raise ValueError(f'{cls_name}: boundary must be one of {BOUNDARIES}, got {boundary!r}')
        if not (
            (isinstance(scale, str) and scale in ('sqrt_n', 'n'))
            or (
                isinstance(scale, Real)
                and not isinstance(scale, bool)
                and math.isfinite(scale)
                and scale > 0
            )
        ):
            raise ValueError(
                f"{cls_name}: scale must be 'sqrt_n', 'n' or a positive float, got {scale!r}"
            )
        self.boundary, self.scale = boundary, scale
        self.circulant_heads = self._per_stage(
            'circulant_heads',
            circulant_heads,
            self.num_stages,
            lambda v: v is None or (_is_int(v) and v >= 1),
        )
        for i, block in enumerate(self.block_types):
            block.check_stage(
                cls_name,
                i,
                dict(
                    embed_dims=self.embed_dims[i],
                    num_heads=self.num_heads[i],
                    circulant_heads=self.circulant_heads[i],
                ),
            )
        if not _is_int(num_cores_max) or num_cores_max < 1:
            raise ValueError(
                f'{cls_name}: num_cores_max must be a positive int, got {num_cores_max!r}'
            )
        self.num_cores_max = int(num_cores_max)
        self._num_cores = self._parse_num_cores(
            num_cores_max if num_cores is None else num_cores, self.num_cores_max
        )
        if not (isinstance(drop_path_rate, Real) and 0 <= drop_path_rate < 1):
            raise ValueError(
                f'{cls_name}: drop_path_rate must be in [0, 1), got {drop_path_rate!r}'
            )
        total = sum(self.depths)
        dpr = [
            drop_path_rate * k / max(total - 1, 1) for k in range(total)
        ]  # linear over all blocks
        self.drop_path_rates = [
            dpr[sum(self.depths[:i]) : sum(self.depths[: i + 1])] for i in range(self.num_stages)
        ]
        if not _is_int(frozen_stages) or not -1 <= frozen_stages <= self.num_stages:
            raise ValueError(
                f'{cls_name}: frozen_stages must be an int in [-1, {self.num_stages}], '
                f'got {frozen_stages!r}'
            )
        self.frozen_stages = int(frozen_stages)
        self.norm_eval = bool(norm_eval)
        self.with_cp = bool(with_cp)

    # ------------------------------------------------------------------ building
    def _build_blocks(self, i: int, **family_ctx) -> List[nn.Module]:
        """The blocks of stage ``i``: its block class built with the arguments it takes
        from the context (``family_ctx``, e.g. ``feedforward_channels``, ``ffn_type``,
        ``sr_ratio``, plus the stage's widths, heads, drop path, circulant options),
        then its block config's options on top."""
        block, options = self.block_types[i], self.block_options[i]
        blocks = []
        for j in range(self.depths[i]):
            ctx = dict(
                family_ctx,
                embed_dims=self.embed_dims[i],
                num_heads=self.num_heads[i],
                drop_path_rate=self.drop_path_rates[i][j],
                block_index=j,
                circulant_heads=self.circulant_heads[i],
                boundary=self.boundary,
                scale=self.scale,
            )
            kwargs = dict(block.stage_kwargs(ctx), **options)
            try:
                blocks.append(block(**kwargs))
            except TypeError as err:
                raise TypeError(
                    f'{type(self).__name__}: stage {i} block {block.__name__}: {err}'
                ) from None
        return blocks

    @property
    def stages(self) -> ModuleList:
        """The stages (:class:`PyramidStage`, each with its ``attention`` kind), held
        under ``stages_attr`` (``layers`` in PVT, ``stages`` in Swin: mmdet's keys)."""
        return self._modules[self.stages_attr]

    def _stem(self, x: torch.Tensor):
        """Before the first stage: (x, hw_shape). Default: nothing (PVT)."""
        return x, None

    def _stem_modules(self) -> List[nn.Module]:
        """Modules frozen by ``frozen_stages >= 0`` (the first patch embedding)."""
        raise NotImplementedError

    def _stage_modules(self, i: int) -> List[nn.Module]:
        """Modules frozen with stage ``i`` (0-based) by ``frozen_stages > i``."""
        modules = [self.stages[i]]
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
        for stage in self.stages:
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
                    trunc_normal_init(m, std=0.02, bias=0.0)
                elif isinstance(m, nn.LayerNorm):
                    constant_init(m, 1.0, bias=0.0)
                elif isinstance(m, nn.Conv2d) and self.conv_init == 'fan_out':
                    fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                    normal_init(m, mean=0, std=math.sqrt(2.0 / fan_out), bias=0.0)
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
        for stage in self.stages:
            stride *= _stride_of(stage.patch_embed)
            ratio = max(
                (getattr(getattr(b, 'attn', None), 'sr_ratio', 1) for b in stage.blocks), default=1
            )
            size = max(size, stride * (ratio - 1) + 1)
            stride *= _stride_of(stage.downsample)
        return size

    def _check_input_size(self, x: torch.Tensor) -> None:
        if (
            torch.jit.is_tracing()
            or torch.compiler.is_compiling()
            or torch.onnx.is_in_onnx_export()
        ):
            return  # symbolic shapes: the check would specialise the graph
        h, w = int(x.shape[-2]), int(x.shape[-1])
        minimum = self.min_input_size
        if min(h, w) < minimum:
            raise ValueError(
                f'{type(self).__name__}: input size {h}x{w} is below the minimum '
                f'{minimum}x{minimum} (spatial-reduction attention needs a map of '
                'at least sr_ratio x sr_ratio in its stage)'
            )

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x (B, in_channels, H, W), H and W >= :attr:`min_input_size`; returns one
        (B, C_i, H_i, W_i) map per index in ``out_indices`` (stage order)."""
        self._check_input_size(x)
        x, hw_shape = self._stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x, hw_shape, out, out_hw = stage(x, hw_shape)
            if i in self.out_indices:
                norm = getattr(self, f'norm{i}', None)
                if norm is not None:
                    out = norm(out)
                outs.append(nlc_to_nchw(out, out_hw).contiguous())
        return tuple(outs)
