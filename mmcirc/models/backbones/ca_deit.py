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
(:func:`mmcirc.models.convert.deit.convert_cadeit_official`). Torch only (see
:mod:`.contract`).
"""

from typing import Optional, Sequence

import torch
from torch import nn

from mmcirc.ops.circulant import CirculantAttention
from ..families import register_family
from .contract import (
    HAS_MMENGINE,
    BackboneContract,
    check_circulant,
    call_block,
    check_images,
    check_positive_int,
    check_rate,
    pad_to_multiple,
    spatial_size,
)

__all__ = ['CADeiT', 'CADeiTBlock', 'Mlp', 'DropPath', 'OUT_TYPES']

#: What a block output becomes (mmpretrain's VisionTransformer ``out_type`` names).
OUT_TYPES = ('featmap', 'avg_featmap', 'raw')


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
        x = self.proj(pad_to_multiple(x, self.patch_size))  # (B, C, H', W')
        hw = spatial_size(x)
        return x.flatten(2).transpose(1, 2), hw


class CADeiTBlock(nn.Module):
    """The official CA-DeiT block: CPE, circulant attention, MLP (pre-LN residuals).
    Arguments as :class:`CADeiT`'s (``dim`` the width, ``num_heads`` its
    ``circulant_heads``, ``drop_path_rate`` this block's; MLP hidden int(dim * mlp_ratio)).
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
        kernel: Optional[str] = None,
    ):
        super().__init__()
        self.cpe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = CirculantAttention(
            dim,
            num_heads=num_heads,
            boundary=boundary,
            scale=scale,
            proj_drop=drop_rate,
            kernel=kernel,
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


class CADeiT(BackboneContract):
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
        kernel (str, optional): the circulant attention's core as ``'torch'`` (FFTs) or
            ``'triton'`` (one Triton kernel where it applies); None: ``MMCIRC_KERNEL``
            (:class:`~mmcirc.ops.circulant.CirculantAttention`).
        with_cp (bool): gradient checkpointing of every block.
        frozen_stages (int): ``-1`` nothing frozen; ``0`` the patch embedding; ``k``
            the patch embedding and the first ``k`` blocks (``depth``: and ``norm``).
        norm_eval (bool): keep the LayerNorms in eval mode while training (no
            effect on LN statistics; kept for the mm interface).
        init_cfg (dict, optional): mmengine init config, e.g.
            ``dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.
    """

    family = 'deit'
    arch_zoo = {
        'tiny': dict(embed_dims=192, depth=12, mlp_ratio=4.0),
        'small': dict(embed_dims=384, depth=12, mlp_ratio=4.0),
        'base': dict(embed_dims=768, depth=12, mlp_ratio=4.0),
    }
    arch_zoo.update({'t': arch_zoo['tiny'], 's': arch_zoo['small'], 'b': arch_zoo['base']})
    arch_names = ('tiny', 'small', 'base')
    arch_keys = ('embed_dims', 'depth')
    arch_defaults = dict(mlp_ratio=4.0)
    stage_unit = 'blocks'

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
        kernel: Optional[str] = None,
        with_cp: bool = False,
        frozen_stages: int = -1,
        norm_eval: bool = False,
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        name = type(self).__name__
        s = self._parse_arch(arch)
        self.embed_dims, self.depth, self.mlp_ratio = s['embed_dims'], s['depth'], s['mlp_ratio']
        self.num_features = self.embed_dims
        self.patch_size = check_positive_int(name, 'patch_size', patch_size)
        check_positive_int(name, 'in_channels', in_channels)
        if out_type not in OUT_TYPES:
            raise ValueError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        check_circulant(name, boundary, scale)
        check_rate(name, 'drop_rate', drop_rate)
        check_rate(name, 'drop_path_rate', drop_path_rate)
        self._setup_contract(
            num_stages=self.depth,
            out_indices=out_indices,
            frozen_stages=frozen_stages,
            norm_eval=norm_eval,
            with_cp=with_cp,
        )
        self.out_type = out_type
        self.final_norm = bool(final_norm)

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
                        kernel=kernel,
                    )
                    for i in range(self.depth)
                ]
            )
        except ValueError as err:
            raise ValueError(f'{name}: {err}') from None
        self.norm = nn.LayerNorm(self.embed_dims, eps=norm_eps)
        self._freeze_stages()

    def _frozen_parts(self):
        """``frozen_stages`` = k: the patch embedding, blocks 0..k-1 (all: and ``norm``)."""
        modules = [self.patch_embed] if self.frozen_stages >= 0 else []
        modules += list(self.blocks[: max(self.frozen_stages, 0)])
        if self.frozen_stages == self.depth:
            modules.append(self.norm)
        return modules, []

    def init_weights(self):
        """The official init (truncated normal std 0.02 linears with zero bias, unit
        LayerNorms, PyTorch's default convs), then ``init_cfg`` (e.g. ``Pretrained``)."""
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
        check_images(type(self).__name__, x)
        x, hw = self.patch_embed(x)  # (B, N, C), N = H/16 * W/16
        outs = []
        for i, block in enumerate(self.blocks):
            x = call_block(block, x, hw) if self.with_cp else block(x, hw)
            if i == self.depth - 1 and self.final_norm:
                x = self.norm(x)
            if i in self.out_indices:
                outs.append(self._format(x, hw))
        return tuple(outs)


register_family(CADeiT)
if HAS_MMENGINE:  # registration needs the OpenMMLab libraries
    from mmcirc.registry import register_model

    register_model(CADeiT)
