"""The pyramid skeleton shared by :class:`CAPVT` and :class:`CASwin`.

METHOD.md, "CA in pyramids": circulant (or core) attention replaces the attention of
the high-resolution stages of PVT and Swin; everything else of the pyramid stays as
it was. Hence one skeleton, :class:`PyramidBackbone` (what it checks and builds:
:mod:`.pyramid_build`), of :class:`PyramidStage` s whose blocks are chosen per stage
(``attention_blocks``: the family's original block, unchanged from mmdet, or one of
:mod:`mmcirc.models.blocks`), keeping the contract of every mmcirc backbone
(:mod:`.contract`).
"""

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmdet.models.layers import nlc_to_nchw
from mmengine.model import BaseModule, ModuleList
from mmengine.model.weight_init import constant_init, normal_init, trunc_normal_, trunc_normal_init

from mmcirc.ops.core import select_cores
from .contract import BackboneContract, ElasticCores, call_block, check_images
from .pyramid_build import PyramidBuild

__all__ = [
    'PyramidStage',
    'PyramidBackbone',
    'grid_size',
]


def grid_size(hw_shape) -> tuple:
    """(H, W) of ``hw_shape`` as ints, except symbolic sizes (``torch.export`` with
    dynamic shapes: one exported graph serves every input size; a ``torch.fx`` leaf
    function in mmcirc.timm). Indexed, not iterated: a ``torch.fx`` proxy takes an index."""
    h, w = hw_shape[0], hw_shape[1]
    return (
        h if isinstance(h, torch.SymInt) else int(h),
        w if isinstance(w, torch.SymInt) else int(w),
    )


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
        bank = any(getattr(b, 'carries_cores', False) for b in blocks)
        self.cores = nn.Parameter(torch.zeros(num_cores_max, embed_dims)) if bank else None
        self.num_cores = num_cores if bank else None

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

    def forward(
        self,
        x: torch.Tensor,
        hw_shape: Optional[Sequence[int]],
        out_norm=None,
        with_out: bool = True,
    ):
        """x: tokens (B, N, C) with ``hw_shape``, or an image/map (B, C, H, W) with
        ``hw_shape`` None when the stage starts with ``patch_embed``. Returns the input
        of the next stage (tokens and their grid) and this stage's output (before
        ``downsample``, through ``out_norm`` when given) as a contiguous map (B, C, H, W),
        computed last (None without ``with_out``)."""
        if self.patch_embed is not None:
            if hw_shape is not None:  # (B, N, C) -> (B, C, H, W) channels-last view, no copy
                x = x.reshape(x.shape[0], hw_shape[0], hw_shape[1], -1).permute(0, 3, 1, 2)
            x, hw_shape = self.patch_embed(x)
        hw_shape = grid_size(hw_shape)
        if self.pos_embed is not None:
            x = self.pos_embed(x, hw_shape)
        cores = None
        if self.cores is not None:  # (B, C', C); B may be symbolic (export)
            cores = select_cores(self.cores, self.num_cores).unsqueeze(0)
            cores = cores.expand(x.shape[0], -1, -1).to(x.dtype)
        for block in self.blocks:
            args = (x, hw_shape) if cores is None else (x, hw_shape, cores)
            out = call_block(block, *args) if self.with_cp else block(*args)
            x, cores = (out, None) if cores is None else out
        if self.norm is not None:
            x = self.norm(x)
        out, out_hw = x, hw_shape
        if self.downsample is not None:
            x, hw_shape = self.downsample(x, hw_shape)
            hw_shape = grid_size(hw_shape)
        if not with_out:
            return x, hw_shape, None
        if out_norm is not None:
            out = out_norm(out)
        return x, hw_shape, nlc_to_nchw(out, out_hw).contiguous()


class PyramidBackbone(PyramidBuild, ElasticCores, BackboneContract):
    """Family-independent part of the CA/Core pyramids (abstract; see CAPVT, CASwin).

    A family's ``__init__`` calls :meth:`_setup`, builds its stem and the stage list
    named ``stages_attr``, each stage with :meth:`_build_stage`, and ends with
    :meth:`_finish`. The stages are public as :attr:`stages`, each with its ``attention``.

    Class attributes:
        family (str): the family name (``'pvt'``, ``'swin'``).
        attention_blocks (dict): ``{kind: block class}`` of the kinds the family takes.
        original_attention (str): the kind of the family's own block (``'sra'``/``'window'``).
        default_attention (str): ``attention`` when none is given.
        stages_attr (str): attribute holding the stage ModuleList (mmdet's name).
        stem (tuple[str, str], optional): the names of the patch embedding before the
            first stage (it returns the tokens and their grid) and of the dropout after
            it; None: each stage embeds its input.
        out_norm (str): the name of stage ``i``'s output norm, ``out_norm.format(i)``
            (``''``: none).
        conv_init (str | None): ``'fan_out'`` to init convs as mmdet's PVT does.

    Per-stage blocks: ``block_cfgs`` (a dict for every stage, or one dict / None per
    stage, as mmcv's ``attn_cfgs``) adds or overrides the block's arguments and may name
    a registered block with ``type`` (built by ``MODELS.build``; it gets the arguments of
    its ``kind``), e.g. ``[dict(type='CirculantBlock', boundary='zero'), None, None,
    None]``; without ``type``, the block of the stage's kind from ``attention`` /
    ``stage_attentions`` (the short form) gets the options.
    """

    arch_zoo: Dict[str, dict] = {}
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    stages_attr: str = 'stages'
    stem: Optional[Tuple[str, str]] = None
    out_norm: str = ''
    conv_init: Optional[str] = None
    #: the smallest H (and W) a built backbone accepts (set by :meth:`_finish`)
    min_input_size: int = 1

    @property
    def stages(self) -> ModuleList:
        """The stages (:class:`PyramidStage`, each with its ``attention`` kind), held
        under ``stages_attr`` (``layers`` in PVT, ``stages`` in Swin: mmdet's keys)."""
        return self._modules[self.stages_attr]

    def _build_stage(self, i: int, blocks: List[nn.Module], **parts) -> PyramidStage:
        """Stage ``i``: its ``blocks`` (:meth:`_build_blocks`) and the family's ``parts``
        (``patch_embed``, ``pos_embed``, ``norm``, ``downsample``)."""
        return PyramidStage(
            self.stage_attentions[i],
            blocks,
            self.embed_dims[i],
            num_cores_max=self.num_cores_max,
            num_cores=self.num_cores,
            with_cp=self.with_cp,
            **parts,
        )

    def _stem_modules(self) -> List[nn.Module]:
        """Modules frozen by ``frozen_stages >= 0`` (the first patch embedding)."""
        raise NotImplementedError

    def _stage_modules(self, i: int) -> List[nn.Module]:
        """Modules frozen with stage ``i`` (0-based) by ``frozen_stages > i``."""
        norm = self._modules.get(self.out_norm.format(i)) if self.out_norm else None
        return [self.stages[i]] if norm is None else [self.stages[i], norm]

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

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x (B, in_channels, H, W), H and W >= ``min_input_size``; returns one
        (B, C_i, H_i, W_i) map per index in ``out_indices`` (stage order)."""
        shape = x.shape
        if type(shape) is torch.Size and (
            len(shape) != 4 or (type(shape[0]) is int and not shape[0])
        ):
            check_images(type(self).__name__, x)  # raises its one line
        h, w = x.shape[-2], x.shape[-1]  # symbolic in a captured graph: not checked there
        if type(h) is int and type(w) is int and min(h, w) < self.min_input_size:
            raise ValueError(
                f'{type(self).__name__}: input size {h}x{w} is below the minimum '
                f'{self.min_input_size}x{self.min_input_size} (spatial-reduction attention '
                'needs a map of at least sr_ratio x sr_ratio in its stage)'
            )
        hw_shape = None
        if self.stem is not None:  # else the first stage embeds the image
            x, hw_shape = self._modules[self.stem[0]](x)
            x = self._modules[self.stem[1]](x)
        outs = []
        for i, stage in enumerate(self._modules[self.stages_attr]):
            taken = i in self.out_indices
            norm = self._modules.get(self.out_norm.format(i)) if taken and self.out_norm else None
            x, hw_shape, out = stage(x, hw_shape, norm, taken)  # out: its map, made last
            if taken:
                outs.append(out)
        return tuple(outs)
