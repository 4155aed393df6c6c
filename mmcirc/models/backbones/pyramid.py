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
* :class:`PyramidBackbone`: argument checking, stochastic depth, the forward loop and
  ``init_weights``; ``arch``, ``out_indices``, ``frozen_stages``, ``norm_eval``,
  ``with_cp`` and elastic core counts are the contract every mmcirc backbone keeps
  (:mod:`.contract`). The family subclasses (``ca_pvt.py``, ``ca_swin.py``) only say
  how a stage is laid out and what their original block is.
"""

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.model import ModuleList
from mmengine.model.weight_init import constant_init, normal_init, trunc_normal_init

from mmcirc.ops.core import CORE_PRESETS
from ..blocks import CirculantBlock, CoreBlock, block_class, block_classes
from .contract import BackboneContract, ElasticCores, check_circulant, check_rate, is_int
from .pyramid_stage import PyramidStage

__all__ = [
    'CORE_PRESETS',
    'CirculantBlock',
    'CoreBlock',
    'PyramidStage',
    'PyramidBackbone',
    'registered_pyramids',
    'stride_of',
]


def stride_of(module: Optional[nn.Module]) -> int:
    """Downsampling factor of an mmcv ``PatchEmbed`` (conv ``projection``) or
    ``PatchMerging`` (``sampler`` unfold); 1 for None."""
    if module is None:
        return 1
    inner = getattr(module, 'projection', None) or getattr(module, 'sampler', None)
    stride = getattr(inner, 'stride', 1)
    return int(stride[0] if isinstance(stride, (tuple, list)) else stride)


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


class PyramidBackbone(ElasticCores, BackboneContract):
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
    arch_keys = ('embed_dims', 'depths', 'num_heads')
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
    def _check_arch(cls, arch: dict) -> dict:
        depths, num_heads = tuple(arch['depths']), tuple(arch['num_heads'])
        embed_dims = cls._stage_widths(arch['embed_dims'], len(depths))
        for name, seq in (('depths', depths), ('num_heads', num_heads), ('embed_dims', embed_dims)):
            if not seq or not all(is_int(v) and v >= 1 for v in seq):
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
        if is_int(embed_dims):
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
    def _stage_kinds(cls, attention, stage_attentions, num_stages: int) -> Tuple[str, ...]:
        """The short form: one attention kind per stage."""
        name, choices = cls.__name__, cls.attention_choices()
        attention = cls.default_attention if attention is None else attention
        if attention not in choices:
            raise ValueError(f'{name}: attention must be one of {choices}, got {attention!r}')
        if stage_attentions is None:
            k = cls.num_replaced_stages
            return (attention,) * min(k, num_stages) + (cls.original_attention,) * max(
                num_stages - k, 0
            )
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
        return kinds

    @classmethod
    def _parse_blocks(cls, attention, stage_attentions, block_cfgs, num_stages: int) -> list:
        """[(block class, block options)] per stage from the short form and ``block_cfgs``."""
        name, kinds_of = cls.__name__, block_classes(cls.family)
        kinds = cls._stage_kinds(attention, stage_attentions, num_stages)
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

    def _setup(
        self,
        *,
        arch,
        attention,
        stage_attentions,
        block_cfgs,
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
    ):
        """Parse and check the arguments every pyramid takes (keyword only, as the
        family's constructor got them; ValueError names the parameter)."""
        cls_name = type(self).__name__
        self.arch_settings = self._parse_arch(arch)
        self.embed_dims = self.arch_settings['embed_dims']
        self.depths = self.arch_settings['depths']
        self.num_heads = self.arch_settings['num_heads']
        self.num_features = list(self.embed_dims)
        n = len(self.depths)
        blocks = self._parse_blocks(attention, stage_attentions, block_cfgs, n)
        self.block_types = tuple(b for b, _ in blocks)
        self.block_options = tuple(o for _, o in blocks)
        self.stage_attentions = tuple(b.kind for b in self.block_types)
        self._setup_contract(
            num_stages=n,
            out_indices=out_indices,
            frozen_stages=frozen_stages,
            norm_eval=norm_eval,
            with_cp=with_cp,
        )
        check_circulant(cls_name, boundary, scale)
        self.boundary, self.scale = boundary, scale
        self.circulant_heads = self._per_stage(
            'circulant_heads', circulant_heads, n, lambda v: v is None or (is_int(v) and v >= 1)
        )
        for i, block in enumerate(self.block_types):
            ctx = dict(
                embed_dims=self.embed_dims[i],
                num_heads=self.num_heads[i],
                circulant_heads=self.circulant_heads[i],
            )
            block.check_stage(cls_name, i, ctx)
        self._setup_cores(num_cores, num_cores_max)
        check_rate(cls_name, 'drop_path_rate', drop_path_rate)
        total = sum(self.depths)
        dpr = [drop_path_rate * k / max(total - 1, 1) for k in range(total)]  # linear, all blocks
        self.drop_path_rates = [
            dpr[sum(self.depths[:i]) : sum(self.depths[: i + 1])] for i in range(n)
        ]

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

    # ------------------------------------------------------------------ contract
    def _apply_num_cores(self, num_cores: int) -> None:
        for stage in self.stages:
            if stage.cores is not None:
                stage.num_cores = num_cores

    def _frozen_parts(self):
        modules = list(self._stem_modules()) if self.frozen_stages >= 0 else []
        for i in range(self.frozen_stages):
            modules += self._stage_modules(i)
        return modules, []

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

    def stage_grids(self, hw: Sequence[int]) -> List[Tuple[int, int]]:
        """The token grid (h, w) each stage's blocks see for an H x W input, stage order.

        Patch embeddings and merges pad the bottom/right, so a stage at total stride s
        (the stem's, its own patch embedding's and every earlier merge's, multiplied)
        sees a ceil(H / s) x ceil(W / s) map (nested ceilings of integer strides are
        the ceiling of their product).
        """
        h, w = (int(v) for v in hw)
        return [(-(-h // s), -(-w // s)) for s in self._stage_strides()]

    def _stage_strides(self) -> List[int]:
        """Total stride of the map each stage's blocks see."""
        stride, strides = stride_of(getattr(self, 'patch_embed', None)), []
        for stage in self.stages:
            stride *= stride_of(stage.patch_embed)
            strides.append(stride)
            stride *= stride_of(stage.downsample)
        return strides

    @property
    def min_input_size(self) -> int:
        """The smallest H (and W) this backbone accepts.

        Circulant, core and window attention take any map, down to 1 x 1. PVT's
        spatial-reduction attention does not: its keys come from a stride-r, kernel-r
        convolution (``attn.sr_ratio`` = r), which needs an r x r map; a stage at total
        stride s sees ceil(H / s) rows (:meth:`stage_grids`), so H >= s * (r - 1) + 1.
        """
        size = 1
        for stage, stride in zip(self.stages, self._stage_strides()):
            ratio = max(
                (getattr(getattr(b, 'attn', None), 'sr_ratio', 1) for b in stage.blocks), default=1
            )
            size = max(size, stride * (ratio - 1) + 1)
        return size

    def _check_input_size(self, x: torch.Tensor) -> None:
        if (
            torch.jit.is_tracing()
            or torch.compiler.is_compiling()
            or torch.onnx.is_in_onnx_export()
            or isinstance(x, torch.fx.Proxy)
        ):
            return  # symbolic shapes: the check would specialise the graph
        h, w = int(x.shape[-2]), int(x.shape[-1])
        checked = self.__dict__.setdefault('_checked_sizes', set())  # sizes accepted
        if (h, w) in checked:
            return
        minimum = self.min_input_size
        if min(h, w) < minimum:
            raise ValueError(
                f'{type(self).__name__}: input size {h}x{w} is below the minimum '
                f'{minimum}x{minimum} (spatial-reduction attention needs a map of '
                'at least sr_ratio x sr_ratio in its stage)'
            )
        checked.add((h, w))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x (B, in_channels, H, W), H and W >= :attr:`min_input_size`; returns one
        (B, C_i, H_i, W_i) map per index in ``out_indices`` (stage order)."""
        self._check_input_size(x)
        x, hw_shape = self._stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            taken = i in self.out_indices
            norm = getattr(self, f'norm{i}', None) if taken else None
            x, hw_shape, out = stage(x, hw_shape, norm, taken)  # out: its map, made last
            if taken:
                outs.append(out)
        return tuple(outs)
