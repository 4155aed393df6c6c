"""The dense self-attention of other libraries that no mmcirc block holds, and the
probes that let the analysis see it (registered with
:func:`~mmcirc.models.blocks.probe.register_attention_probe`):

* ``'vit'``: the self-attention of a plain ViT / DeiT (mmpretrain's
  ``MultiheadAttention`` with a fused ``qkv``, timm's ``Attention``): what CA-DeiT's
  circulant attention replaces. Class/register tokens (the leading ``N - H*W``) are
  dropped; the grid is the last patch embedding's output. Form ``'matrix'``.
* ``'mha'``: torch's ``nn.MultiheadAttention`` and mmcv's ``MultiheadAttention``
  wrapper anywhere else (heads, necks): attention for the FLOP count only (their
  token grid is unknown).

The classes are recognised lazily: a library is never imported here.
"""

import functools
from typing import Optional, Tuple

import torch
from torch import nn

from .probe import AttentionProbe, call_arg, lazy_classes, register_attention_probe

__all__ = ['ViTProbe', 'MHAProbe', 'patch_grid']


#: (module, class) of the patch embeddings whose output grid a ViT's tokens lie on
_PATCH_EMBEDS = (
    ('mmcv.cnn.bricks.transformer', 'PatchEmbed'),  # mmpretrain's ViT / DeiT
    ('mmpretrain.models.utils.embed', 'PatchEmbed'),
    ('mmseg.models.utils.embed', 'PatchEmbed'),
    ('mmdet.models.layers.transformer.utils', 'PatchEmbed'),
    ('timm.layers', 'PatchEmbed'),  # and its subclasses
)


def _patch_embed_classes() -> tuple:
    return sum((lazy_classes(path, [name]) for path, name in _PATCH_EMBEDS), ())


def patch_grid(m: nn.Module, inputs, output) -> Optional[Tuple[int, int]]:
    """Token grid produced by a patch embedding (mmcv/mmpretrain: (x, hw); timm: x)."""
    if (
        isinstance(output, (tuple, list))
        and len(output) == 2
        and isinstance(output[1], (tuple, list))
    ):
        return tuple(int(v) for v in output[1])
    if isinstance(output, torch.Tensor) and output.dim() == 4:  # timm NHWC output
        return int(output.shape[1]), int(output.shape[2])
    x = inputs[0] if inputs else None
    if isinstance(x, torch.Tensor) and x.dim() == 4 and hasattr(m, 'dynamic_feat_size'):
        return tuple(int(v) for v in m.dynamic_feat_size(tuple(x.shape[-2:])))
    grid = getattr(m, 'grid_size', None)
    return tuple(int(v) for v in grid) if grid is not None else None


class ViTProbe(AttentionProbe):
    """Plain self-attention x (B, N, C) with a fused qkv (mmpretrain / timm): exact
    classes only (subclasses may change the math)."""

    kind = 'vit'
    form = 'matrix'

    def matches(self, m):
        cls = lazy_classes('mmpretrain.models.utils.attention', ['MultiheadAttention'])
        cls += lazy_classes('timm.layers', ['Attention'])
        return bool(cls) and type(m) in cls

    def observe(self, model, ctx):
        def hook(m, inputs, output):
            grid = patch_grid(m, inputs, output)
            if grid is not None:
                ctx.patch_grid = grid

        classes = _patch_embed_classes()
        return [(m, hook) for m in model.modules() if classes and isinstance(m, classes)]

    def weights(self, mod, args, kwargs, ctx):
        x = call_arg(args, kwargs, 0, 'x')
        b, n, c = x.shape
        h = mod.num_heads
        qkv = mod.qkv(x).reshape(b, n, 3, h, -1).permute(2, 0, 3, 1, 4)
        q, k = qkv[0], qkv[1]  # (B, h, N, d)
        q_norm, k_norm = getattr(mod, 'q_norm', None), getattr(mod, 'k_norm', None)  # timm
        if q_norm is not None and not isinstance(q_norm, nn.Identity):
            q = q_norm(q)
        if k_norm is not None and not isinstance(k_norm, nn.Identity):
            k = k_norm(k)
        sdpa = getattr(mod, 'scaled_dot_product_attention', None)
        if isinstance(sdpa, functools.partial) and sdpa.keywords.get('scale'):
            scale = 1.0 / sdpa.keywords['scale']  # mmpretrain's qk_scale path divides by it
        else:
            scale = getattr(mod, 'scale', None) or q.shape[-1] ** -0.5
        attn = (q * scale) @ k.transpose(-2, -1)  # (B, h, N, N)
        mask = call_arg(args, kwargs, 1, 'attn_mask')  # timm
        if mask is not None:
            attn = (
                attn.masked_fill(~mask, float('-inf')) if mask.dtype == torch.bool else attn + mask
            )
        attn = torch.softmax(attn, dim=-1)
        grid = getattr(ctx, 'patch_grid', None)
        if grid is None:
            raise ValueError(
                f'{type(mod).__name__}: no patch grid seen before this attention '
                f'(N={n}); the model needs a patch embedding module'
            )
        extra = n - grid[0] * grid[1]
        if extra < 0:
            raise ValueError(
                f'{type(mod).__name__}: {n} tokens but a {grid[0]}x{grid[1]} patch grid'
            )
        return dict(weights=attn[..., extra:, extra:], q_grid=grid, k_grid=grid)


class MHAProbe(AttentionProbe):
    """torch's / mmcv's multi-head attention outside any other attention layer."""

    kind = 'mha'
    form = None

    def matches(self, m):
        cls = lazy_classes('mmcv.cnn.bricks.transformer', ['MultiheadAttention'])
        return isinstance(m, nn.MultiheadAttention) or bool(cls) and isinstance(m, cls)


register_attention_probe(ViTProbe())
register_attention_probe(MHAProbe())
