"""What a pyramid checks and builds (:class:`PyramidBuild`, a mixin of
:class:`~.pyramid.PyramidBackbone`): the arguments every pyramid takes, the blocks of
each stage from the family's ``attention_blocks`` and explicit keyword arguments, and the
geometry the forward relies on (the grids the stages see, the smallest input), all
decided when the model is built, so that a forward runs only the modules' own calls.
"""

from typing import Dict, List, Optional, Sequence, Tuple

import torch.nn as nn

from mmcirc.registry import model_registries
from ..blocks import PyramidBlock, StageOptions
from .contract import check_circulant, check_positive_int, check_rate, is_int

__all__ = ['PyramidBuild', 'stride_of']


def stride_of(module: Optional[nn.Module]) -> int:
    """Downsampling factor of an mmcv ``PatchEmbed`` (conv ``projection``) or
    ``PatchMerging`` (``sampler`` unfold); 1 for None."""
    if module is None:
        return 1
    inner = getattr(module, 'projection', None) or getattr(module, 'sampler', None)
    stride = getattr(inner, 'stride', 1)
    return int(stride[0] if isinstance(stride, (tuple, list)) else stride)


class PyramidBuild:
    """Parsing, checking and building of a pyramid (see the module docstring); the class
    attributes it reads are :class:`~.pyramid.PyramidBackbone`'s."""

    family: str = ''
    attention_blocks: Dict[str, type] = {}
    original_attention: str = ''
    default_attention: str = 'circulant'
    #: the MLP of the circulant and core blocks (:func:`~..blocks.build_ffn`)
    ffn_type: str = 'ffn'
    #: Stages that take circulant/core attention in the paper's layout.
    num_replaced_stages: int = 2

    @classmethod
    def attention_choices(cls) -> Tuple[str, ...]:
        """The attention kinds this family takes (its ``attention_blocks``)."""
        return tuple(cls.attention_blocks)

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
    def _per_stage(name: str, value, num_stages: int, check) -> tuple:
        """Broadcast a scalar to all stages, or check a sequence has one per stage; then
        ``check`` each value."""
        if isinstance(value, (list, tuple)):
            if len(value) != num_stages:
                raise ValueError(
                    f'{name} must have {num_stages} entries (one per stage), '
                    f'got {len(value)}: {tuple(value)!r}'
                )
            values = tuple(value)
        else:
            values = (value,) * num_stages
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
            for b, _, _ in cls._parse_blocks(attention, stage_attentions, block_cfgs, num_stages)
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
        """[(block class, type name or None, block options)] per stage from the short
        form and ``block_cfgs``; a ``type`` is looked up by name in mmdet's MODELS."""
        name, kinds = cls.__name__, cls._stage_kinds(attention, stage_attentions, num_stages)
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
            block = cls.attention_blocks[kind]
            if btype is not None:
                found = model_registries()[0].get(btype) if isinstance(btype, str) else btype
                if not (
                    isinstance(found, type)
                    and issubclass(found, PyramidBlock)
                    and found.kind in cls.attention_blocks
                ):
                    blocks = cls.attention_blocks
                    raise ValueError(
                        f'{name}: block_cfgs[{i}]: block type must be a registered block '
                        f'(kinds {tuple(blocks)}, classes '
                        f'{tuple(b.__name__ for b in blocks.values())}), got {btype!r}'
                    )
                if stage_attentions is not None and found.kind != kind:
                    raise ValueError(
                        f'{name}: block_cfgs[{i}] type {btype!r} is {found.kind!r} attention '
                        f'but stage_attentions[{i}] is {kind!r}'
                    )
                block = found
            out.append((block, btype, options))
        return out

    def _setup(
        self,
        *,
        arch,
        attention,
        stage_attentions,
        block_cfgs,
        in_channels,
        qkv_bias,
        out_indices,
        drop_rate,
        attn_drop_rate,
        drop_path_rate,
        circulant_heads,
        boundary,
        scale,
        num_cores,
        num_cores_max,
        core_chunk_size,
        core_cpe,
        act_cfg,
        norm_cfg,
        frozen_stages,
        norm_eval,
        with_cp,
    ) -> None:
        """Parse and check the arguments every pyramid takes (ValueError names the
        parameter); each stage's block class takes its part of them (``stage_args``)."""
        cls_name = type(self).__name__
        s = self.arch_settings = self._parse_arch(arch)
        self.embed_dims, self.depths, self.num_heads = s['embed_dims'], s['depths'], s['num_heads']
        self.num_features = list(self.embed_dims)
        n = len(self.depths)
        blocks = self._parse_blocks(attention, stage_attentions, block_cfgs, n)
        self.block_types, self.block_cfg_types, self.block_options = map(tuple, zip(*blocks))
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
        self._stage_args = tuple(
            block.stage_args(
                StageOptions(
                    owner=cls_name,
                    index=i,
                    embed_dims=self.embed_dims[i],
                    num_heads=self.num_heads[i],
                    ffn_type=self.ffn_type,
                    circulant_heads=self.circulant_heads[i],
                    boundary=boundary,
                    scale=scale,
                    qkv_bias=qkv_bias,
                    attn_drop_rate=attn_drop_rate,
                    core_cpe=core_cpe,
                    core_chunk_size=core_chunk_size,
                )
            )
            for i, block in enumerate(self.block_types)
        )
        self._setup_cores(num_cores, num_cores_max)
        check_rate(cls_name, 'drop_path_rate', drop_path_rate)
        total = sum(self.depths)
        dpr = [drop_path_rate * k / max(total - 1, 1) for k in range(total)]  # linear, all blocks
        self.drop_path_rates = [
            dpr[sum(self.depths[:i]) : sum(self.depths[: i + 1])] for i in range(n)
        ]
        check_positive_int(cls_name, 'in_channels', in_channels)
        self._mlp_args = dict(drop_rate=drop_rate, act_cfg=act_cfg, norm_cfg=norm_cfg)

    def _build_blocks(self, i: int, mlp_ratio, own: dict) -> List[nn.Module]:
        """The blocks of stage ``i`` (see :class:`~.pyramid.PyramidBackbone`): every kind
        takes the family's MLP (``feedforward_channels`` = ``mlp_ratio`` x width), the
        family's own block also ``own``, the others their ``stage_args``; then each
        block's drop path rate and ``block_args``, and the block config's options on top."""
        dims = self.embed_dims[i]
        args = dict(embed_dims=dims, feedforward_channels=int(mlp_ratio * dims), **self._mlp_args)
        original = self.stage_attentions[i] == self.original_attention
        args.update(own if original else self._stage_args[i])
        block, btype, options = self.block_types[i], self.block_cfg_types[i], self.block_options[i]
        blocks = []
        for j in range(self.depths[i]):
            kwargs = dict(args, drop_path_rate=self.drop_path_rates[i][j], **block.block_args(j))
            kwargs.update(options)
            try:
                blocks.append(
                    block(**kwargs)
                    if btype is None
                    else model_registries()[0].build(dict(type=btype, **kwargs))
                )
            except TypeError as err:
                raise TypeError(
                    f'{type(self).__name__}: stage {i} block {block.__name__}: {err}'
                ) from None
        return blocks

    def _finish(self) -> None:
        """The end of a family's ``__init__``: the smallest input it accepts
        (:meth:`_min_input_size`, checked by the forward) and the frozen stages."""
        self.min_input_size = self._min_input_size()
        self._freeze_stages()

    def stage_grids(self, hw: Sequence[int]) -> List[Tuple[int, int]]:
        """The token grid (h, w) each stage's blocks see for an H x W input, stage order:
        patch embeddings and merges pad the bottom/right, so a stage at total stride s
        (:meth:`stage_strides`) sees a ceil(H / s) x ceil(W / s) map (nested ceilings of
        integer strides are the ceiling of their product)."""
        h, w = (int(v) for v in hw)
        return [(-(-h // s), -(-w // s)) for s in self.stage_strides()]

    def stage_strides(self) -> List[int]:
        """Total stride of the map each stage's blocks see (the stem's, its own patch
        embedding's and every earlier merge's, multiplied)."""
        stride, strides = stride_of(self._modules[self.stem[0]] if self.stem else None), []
        for stage in self.stages:
            stride *= stride_of(stage.patch_embed)
            strides.append(stride)
            stride *= stride_of(stage.downsample)
        return strides

    def _min_input_size(self) -> int:
        """The smallest H (and W) this backbone accepts (``min_input_size``): a block
        takes an r x r map at least (its ``min_grid``: 1 but where it reduces its keys by
        a stride-r convolution); a stage at total stride s sees ceil(H / s) rows
        (:meth:`stage_grids`), so H >= s * (r - 1) + 1."""
        size = 1
        for stage, stride in zip(self.stages, self.stage_strides()):
            grid = max((b.min_grid() for b in stage.blocks), default=1)
            size = max(size, stride * (grid - 1) + 1)
        return size
