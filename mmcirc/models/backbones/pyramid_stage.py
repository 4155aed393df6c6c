"""One stage of the CA/Core pyramids (:class:`PyramidStage`), see :mod:`.pyramid`."""

from typing import List, Optional, Sequence

import torch
import torch.nn as nn
from mmdet.models.layers import nlc_to_nchw
from mmengine.model import BaseModule, ModuleList
from mmengine.model.weight_init import trunc_normal_

from mmcirc.ops.core import select_cores
from ..blocks.base import tokens_as_map
from .contract import call_block

__all__ = ['PyramidStage', 'grid_size']


def grid_size(s):
    """``int(s)``, except a symbolic size (``torch.export`` with dynamic shapes), which
    stays symbolic so that one exported graph serves every input size (a ``torch.fx``
    leaf function in mmcirc.timm: a traced graph makes it an int when it runs)."""
    return s if isinstance(s, torch.SymInt) else int(s)


def _grid(hw_shape) -> tuple:
    """(H, W) of ``hw_shape`` through :func:`grid_size` (indexed, not iterated: a
    ``torch.fx`` proxy of a pair takes an index)."""
    return grid_size(hw_shape[0]), grid_size(hw_shape[1])


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

    ``forward(x, hw_shape, out_norm=None, with_out=True) -> (x_next, hw_next, out)``:
    the input of the next stage (tokens (B, N, C) and their grid) and this stage's
    output (before ``downsample``, through ``out_norm`` when given) as a contiguous map
    (B, C, H, W), computed last (None without ``with_out``).
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

    def forward(
        self,
        x: torch.Tensor,
        hw_shape: Optional[Sequence[int]],
        out_norm=None,
        with_out: bool = True,
    ):
        """x: tokens (B, N, C) with ``hw_shape``, or an image/map (B, C, H, W) with
        ``hw_shape`` None when the stage starts with ``patch_embed``. Returns
        (x_next, hw_next, out), ``out`` the map (B, C, H, W) of the stage's output."""
        if self.patch_embed is not None:
            if hw_shape is not None:  # (B, N, C) -> (B, C, H, W) channels-last view, no copy
                x = tokens_as_map(x, hw_shape)
            x, hw_shape = self.patch_embed(x)
        hw_shape = _grid(hw_shape)
        if self.pos_embed is not None:
            x = self.pos_embed(x, hw_shape)
        if self.cores is None:
            for block in self.blocks:
                x = call_block(block, x, hw_shape, with_cp=self.with_cp)
        else:
            cores = (
                select_cores(self.cores, self.num_cores)
                .unsqueeze(0)
                .expand(x.shape[0], -1, -1)
                .to(x.dtype)
            )  # (B, C', C); B may be symbolic (export)
            for block in self.blocks:
                x, cores = call_block(block, x, hw_shape, cores, with_cp=self.with_cp)
        if self.norm is not None:
            x = self.norm(x)
        out, out_hw = x, hw_shape
        if self.downsample is not None:
            x, hw_shape = self.downsample(x, hw_shape)
            hw_shape = _grid(hw_shape)
        if not with_out:
            return x, hw_shape, None
        if out_norm is not None:
            out = out_norm(out)
        return x, hw_shape, nlc_to_nchw(out, out_hw).contiguous()
