"""CA-DeiT: the isotropic circulant-attention ViT of the official CA repository
(github.com/LeapLabTHU/Circulant-Attention, ``models/ca_deit.py``; METHOD.md 3.1).

Layout (the official one): a 16 x 16 patch embedding (conv, no norm), no class token,
no position embedding, then ``depth`` blocks::

    x = x + CPE(x)               3x3 depthwise conv with bias, zero padded
    x = x + DropPath(CA(LN(x)))  circulant attention, d = 1 (one head per channel)
    x = x + DropPath(MLP(LN(x))) fc1 -> GELU -> fc2, hidden = 4 x width

then a final LN and the mean over the tokens (the classifier is a linear head on it).
LN eps 1e-6. Sizes: tiny 192, small 384, base 768, all 12 blocks.

Differences from the official code, none of which changes its numbers on the square
maps it accepts: any H x W (the official code takes ``h = w = sqrt(n)``; non-square
maps use :class:`~mmcirc.ops.circulant.CirculantAttention`'s general path), an input
that is not a multiple of the patch size is zero padded at the bottom / right (mmcv's
``'corner'`` padding), and the model returns feature maps of chosen blocks for dense
prediction.

Parameter names are the official (timm) ones without the classifier ``head``:
``patch_embed.proj``, ``blocks.{k}.{cpe, norm1, attn.{gate.0, qkv, proj}, norm2,
mlp.fc1, mlp.fc2}``, ``norm``. The official checkpoint converts with
``tools/model_converters/cadeit_to_mmcirc.py --family deit``
(:func:`mmcirc.models.convert_isotropic.convert_cadeit_official`).

This file needs torch only; with mmengine installed, :class:`CADeiT` is an mmengine
``BaseModule`` (``init_cfg``) registered in the MODELS registries of mmdet, mmseg and
mmpretrain.
"""

import importlib.util
from numbers import Integral, Real
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmcirc.ops.circulant import BOUNDARIES, CirculantAttention

_HAS_MMENGINE = importlib.util.find_spec('mmengine') is not None
if _HAS_MMENGINE:
    from mmengine.model import BaseModule
else:  # torch only: init_cfg is stored and ignored

    class BaseModule(nn.Module):
        """Stand-in for mmengine's BaseModule (no init_cfg handling)."""

        def __init__(self, init_cfg=None):
            super().__init__()
            self.init_cfg = init_cfg
            self.is_init = False

        def init_weights(self):
            self.is_init = True


__all__ = ['CADeiT', 'CADeiTBlock', 'Mlp', 'DropPath', 'OUT_TYPES']

#: What a block output becomes (mmpretrain's VisionTransformer ``out_type`` names).
OUT_TYPES = ('featmap', 'avg_featmap', 'raw')


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def parse_block_indices(out_indices, depth: int) -> tuple:
    """``out_indices`` of an isotropic model (an int or ints in [-depth, depth - 1]) ->
    sorted, non-negative, unique block indices; ValueError naming the range otherwise."""
    if _is_int(out_indices):
        out_indices = (out_indices,)
    if (
        not isinstance(out_indices, (list, tuple))
        or not out_indices
        or not all(_is_int(i) and -depth <= i < depth for i in out_indices)
    ):
        raise ValueError(
            f'out_indices must be an int or a non-empty sequence of ints in '
            f'[-{depth}, {depth - 1}] (blocks 0..{depth - 1}), got {out_indices!r}'
        )
    return tuple(sorted({int(i) % depth for i in out_indices}))


def _hw(x: torch.Tensor) -> tuple:
    """(H, W) of a (..., H, W) tensor: ints (eager; under ``torch.jit.trace``, whose
    sizes are tensors, made ints), torch.export's symbolic sizes left symbolic (an
    ``int()`` there would bake the traced size into a dynamic graph)."""
    h, w = x.shape[-2], x.shape[-1]
    return (int(h), int(w)) if torch.jit.is_tracing() else (h, w)


# --------------------------------------------------------------------------- layers
class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample (training only)."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, x):
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self):
        return f'drop_prob={self.drop_prob}'


class Mlp(nn.Module):
    """fc1 -> GELU -> dropout -> fc2 -> dropout (timm's ``Mlp`` names)."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class PatchEmbed(nn.Module):
    """Non-overlapping ``patch_size`` conv; bottom/right zero padding to a multiple."""

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, stride=patch_size)

    def forward(self, x):
        """x (B, C_in, H, W) -> tokens (B, N, C), (H', W')."""
        p = self.patch_size
        pad_h, pad_w = -x.shape[-2] % p, -x.shape[-1] % p
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        x = self.proj(x)  # (B, C, H', W')
        hw = _hw(x)
        return x.flatten(2).transpose(1, 2), hw


# --------------------------------------------------------------------------- block
class CADeiTBlock(nn.Module):
    """The official CA-DeiT block: CPE, circulant attention, MLP (pre-LN residuals).

    Args:
        dim (int): width C. mlp_ratio (float): MLP hidden = int(C * mlp_ratio).
        drop_rate (float): dropout after the attention projection and in the MLP.
        drop_path_rate (float): stochastic depth of both residual branches.
        num_heads (int, optional): circulant heads (None: d = 1, the official).
        boundary (str), scale (str | float): see :class:`CirculantAttention`.
        norm_eps (float): LayerNorm eps.
    """

    def __init__(
        self,
        dim: int,
        mlp_ratio: float = 4.0,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        num_heads: Optional[int] = None,
        boundary: str = 'circular',
        scale='sqrt_n',
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        self.cpe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = CirculantAttention(
            dim, num_heads=num_heads, boundary=boundary, scale=scale, proj_drop=drop_rate
        )
        self.drop_path = DropPath(drop_path_rate)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop_rate)

    def forward(self, x: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
        """x (B, N, C) tokens of an H x W map (row-major), hw_shape (H, W)."""
        b, n, c = x.shape
        grid = x.transpose(1, 2).reshape(b, c, *hw_shape)  # (B, C, H, W)
        x = x + self.cpe(grid).flatten(2).transpose(1, 2)  # (B, N, C)
        x = x + self.drop_path(self.attn(self.norm1(x), tuple(hw_shape)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


# --------------------------------------------------------------------------- model
class CADeiT(BaseModule):
    """CA-DeiT backbone (official layout) for mmpretrain, mmseg and mmdet.

    Args:
        arch (str | dict): ``'tiny'`` / ``'small'`` / ``'base'`` (widths 192 / 384 /
            768, 12 blocks, MLP ratio 4), or a dict with ``embed_dims`` and ``depth``
            (and optionally ``mlp_ratio``).
        patch_size (int): patch embedding kernel = stride (16).
        in_channels (int): image channels.
        out_indices (int | Sequence[int]): blocks whose outputs are returned (negative
            counts from the end; ``-1`` = the last block).
        out_type (str): ``'featmap'`` (B, C, H/16, W/16) maps for dense prediction,
            ``'avg_featmap'`` (B, C) mean over the tokens (the official pooled
            feature, for mmpretrain's ``LinearClsHead``), ``'raw'`` (B, N, C) tokens.
        final_norm (bool): apply the final LN ``norm`` to the last block's output (as
            the official model does before pooling; mmseg/mmpretrain ViT convention:
            other blocks' outputs are returned without a norm).
        drop_rate (float): dropout in the attention projection and MLP.
        drop_path_rate (float): stochastic depth, linear from 0 over the blocks
            (official: T 0.0, S 0.1, B 0.4 for training).
        circulant_heads (int, optional): circulant heads (None: d = 1, official).
        boundary (str): ``'circular'`` (official) or ``'zero'``.
        scale (str | float): ``'sqrt_n'`` (official) or ``'n'`` / a float.
        norm_eps (float): eps of every LayerNorm (official 1e-6).
        with_cp (bool): gradient checkpointing of every block.
        frozen_stages (int): ``-1`` nothing frozen; ``0`` the patch embedding; ``k``
            the patch embedding and the first ``k`` blocks (``depth``: and ``norm``).
        norm_eval (bool): keep the LayerNorms in eval mode while training (no
            effect on LN statistics; kept for the mm interface).
        init_cfg (dict, optional): mmengine init config, e.g.
            ``dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.
    """

    arch_zoo = {
        'tiny': dict(embed_dims=192, depth=12, mlp_ratio=4.0),
        'small': dict(embed_dims=384, depth=12, mlp_ratio=4.0),
        'base': dict(embed_dims=768, depth=12, mlp_ratio=4.0),
    }
    arch_zoo.update({'t': arch_zoo['tiny'], 's': arch_zoo['small'], 'b': arch_zoo['base']})

    def __init__(
        self,
        arch='tiny',
        patch_size: int = 16,
        in_channels: int = 3,
        out_indices=-1,
        out_type: str = 'featmap',
        final_norm: bool = True,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        circulant_heads: Optional[int] = None,
        boundary: str = 'circular',
        scale='sqrt_n',
        norm_eps: float = 1e-6,
        with_cp: bool = False,
        frozen_stages: int = -1,
        norm_eval: bool = False,
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        name = type(self).__name__
        settings = self._parse_arch(arch)
        self.embed_dims = settings['embed_dims']
        self.depth = settings['depth']
        self.mlp_ratio = settings['mlp_ratio']
        self.num_features = self.embed_dims
        for key, value in (('patch_size', patch_size), ('in_channels', in_channels)):
            if not _is_int(value) or value < 1:
                raise ValueError(f'{name}: {key} must be a positive int, got {value!r}')
        if out_type not in OUT_TYPES:
            raise ValueError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        if boundary not in BOUNDARIES:
            raise ValueError(f'{name}: boundary must be one of {BOUNDARIES}, got {boundary!r}')
        for key, value in (('drop_rate', drop_rate), ('drop_path_rate', drop_path_rate)):
            if not (isinstance(value, Real) and not isinstance(value, bool) and 0 <= value < 1):
                raise ValueError(f'{name}: {key} must be in [0, 1), got {value!r}')
        if not _is_int(frozen_stages) or not -1 <= frozen_stages <= self.depth:
            raise ValueError(
                f'{name}: frozen_stages must be an int in [-1, {self.depth}], got {frozen_stages!r}'
            )
        self.out_indices = parse_block_indices(out_indices, self.depth)
        self.out_type = out_type
        self.final_norm = bool(final_norm)
        self.with_cp = bool(with_cp)
        self.frozen_stages = int(frozen_stages)
        self.norm_eval = bool(norm_eval)
        self.patch_size = int(patch_size)

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims, patch_size)
        dpr = torch.linspace(0, drop_path_rate, self.depth, device='cpu').tolist()  # official rule
        try:
            self.blocks = nn.ModuleList(
                [
                    CADeiTBlock(
                        self.embed_dims,
                        self.mlp_ratio,
                        drop_rate=drop_rate,
                        drop_path_rate=dpr[i],
                        num_heads=circulant_heads,
                        boundary=boundary,
                        scale=scale,
                        norm_eps=norm_eps,
                    )
                    for i in range(self.depth)
                ]
            )
        except ValueError as err:
            raise ValueError(f'{name}: {err}') from None
        self.norm = nn.LayerNorm(self.embed_dims, eps=norm_eps)
        self._freeze_stages()

    # ------------------------------------------------------------------ parsing
    @classmethod
    def _parse_arch(cls, arch) -> dict:
        names = ('tiny', 'small', 'base')
        if isinstance(arch, str):
            if arch.lower() not in cls.arch_zoo:
                raise ValueError(
                    f'{cls.__name__}: arch must be one of {names} or a dict with keys '
                    f'embed_dims, depth[, mlp_ratio]; got {arch!r}'
                )
            return dict(cls.arch_zoo[arch.lower()])
        if not isinstance(arch, dict):
            raise ValueError(
                f'{cls.__name__}: arch must be a str in {names} or a dict, got {type(arch).__name__}'
            )
        if not {'embed_dims', 'depth'} <= set(arch) <= {'embed_dims', 'depth', 'mlp_ratio'}:
            raise ValueError(
                f'{cls.__name__}: an arch dict needs the keys embed_dims, depth (and optionally '
                f'mlp_ratio), got {sorted(arch)}'
            )
        out = dict(mlp_ratio=4.0)
        out.update(arch)
        for key in ('embed_dims', 'depth'):
            if not _is_int(out[key]) or out[key] < 1:
                raise ValueError(
                    f'{cls.__name__}: arch {key} must be a positive int, got {out[key]!r}'
                )
        if not (isinstance(out['mlp_ratio'], Real) and out['mlp_ratio'] > 0):
            raise ValueError(
                f'{cls.__name__}: arch mlp_ratio must be positive, got {out["mlp_ratio"]!r}'
            )
        return out

    # ------------------------------------------------------------------ mm contract
    def _freeze_stages(self) -> None:
        modules = []
        if self.frozen_stages >= 0:
            modules.append(self.patch_embed)
        modules += list(self.blocks[: max(self.frozen_stages, 0)])
        if self.frozen_stages == self.depth:
            modules.append(self.norm)
        for m in modules:
            m.eval()
            for param in m.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True):
        """Train/eval mode, keeping frozen parts (and with ``norm_eval`` the norms) in eval."""
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.eval()
        return self

    def init_weights(self):
        """The official init (truncated normal std 0.02 linears with zero bias, unit
        LayerNorms, PyTorch's default for the convs), then mmengine's ``init_cfg``
        (e.g. ``Pretrained``) on top."""
        if not getattr(self, 'is_init', False):
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
        super().init_weights()

    # ------------------------------------------------------------------ forward
    def _block(self, block, x, hw):
        if self.with_cp and torch.is_grad_enabled() and x.requires_grad:
            return checkpoint(block, x, hw, use_reentrant=False)
        return block(x, hw)

    def _format(self, x: torch.Tensor, hw) -> torch.Tensor:
        if self.out_type == 'raw':
            return x  # (B, N, C)
        if self.out_type == 'avg_featmap':
            return x.mean(dim=1)  # (B, C): the official pooled feature
        b, n, c = x.shape
        return x.transpose(1, 2).reshape(b, c, *hw).contiguous()  # (B, C, H, W)

    def forward(self, x: torch.Tensor) -> tuple:
        """x (B, in_channels, H, W), any H and W. Returns one output per index in
        ``out_indices`` (block order), shaped by ``out_type``."""
        x, hw = self.patch_embed(x)  # (B, N, C), N = H/16 * W/16
        outs = []
        for i, block in enumerate(self.blocks):
            x = self._block(block, x, hw)
            if i == self.depth - 1 and self.final_norm:
                x = self.norm(x)
            if i in self.out_indices:
                outs.append(self._format(x, hw))
        return tuple(outs)


if _HAS_MMENGINE:  # registration needs the OpenMMLab libraries
    from mmcirc.registry import register_model

    register_model(CADeiT)
