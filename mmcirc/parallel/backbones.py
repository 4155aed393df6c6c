"""Sharded backbone parts: each wraps (never copies) a built module and returns this
rank's band of its single-process output.

* :class:`ShardedPatchEmbed`: mmcv's ``PatchEmbed`` (``AdaptivePadding`` from the
  global size, the projection a :class:`~mmcirc.parallel.layers.ShardedConv2d`); also
  the bottom / right zero padding of CA-DeiT's and VECA's patch embeddings;
* :class:`ShardedPositionEmbedding`: mmdet PVT's ``AbsolutePositionEmbedding``, the
  band of the bilinearly resized table (no communication: the table is small);
* :class:`ShardedSRA`: PVT's spatial-reduction attention, queries local, the reduced
  keys / values (the band of the stride-r conv, then an ``all_gather``) whole;
* :class:`GlobalShape`: gives a sharded attention (circulant) the global (H, W) from
  the local band's shape;
* :class:`ShardedCorePeriphery` and :func:`veca_forward`: VECA's block-sparse
  attention (cores see every patch: the softmax over the patches of all ranks as a
  streaming max / sum reduction; patches see the cores: local) and its forward with
  the patch coordinates of the band's global rows.

Token maps are (B, h_r W, C) with the LOCAL hw_shape (h_r, W) everywhere, as the
single-process blocks take them; sharded layers find the global layout themselves.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .comm import gather_rows, group_rank_size, row_offsets
from .layers import ShardedConv2d, interpolate_full

__all__ = [
    'ShardedPatchEmbed',
    'ShardedPositionEmbedding',
    'ShardedSRA',
    'GlobalShape',
    'ShardedCorePeriphery',
    'veca_forward',
]


def _nlc_to_nchw(x, hw):
    b, n, c = x.shape
    return x.transpose(1, 2).reshape(b, c, hw[0], hw[1])  # (B, C, h, W)


class ShardedPatchEmbed(nn.Module):
    """mmcv ``PatchEmbed`` (``adaptive_padding``, ``projection``, ``norm``) or a plain
    patch embedding (``proj`` conv, optional ``norm``) with bottom / right zero padding
    to a multiple of the stride (``pad_to_stride=True``: CA-DeiT, VECA).

    ``forward(x)``: x (B, C, h_r, W) -> (tokens (B, h'_r W', C'), (h'_r, W'))."""

    def __init__(self, embed: nn.Module, group=None, pad_to_stride: bool = False):
        super().__init__()
        self.embed = embed
        self.group = group
        self.pad_to_stride = pad_to_stride
        conv = embed.proj if pad_to_stride else embed.projection
        self.proj = ShardedConv2d(conv, group=group)

    def forward(self, x: torch.Tensor):
        e = self.embed
        (layout,) = row_offsets(x.shape[-2], group=self.group)
        h, w = layout.height, x.shape[-1]
        if self.pad_to_stride:
            s = self.proj.conv.stride
            top, left, pad_h, pad_w = 0, 0, -h % s[0], -w % s[1]
        elif getattr(e, 'adaptive_padding', None) is not None:
            ap = e.adaptive_padding
            pad_h, pad_w = ap.get_pad_shape((h, w))
            top, left = (pad_h // 2, pad_w // 2) if ap.padding == 'same' else (0, 0)
        else:
            top = left = pad_h = pad_w = 0
        if pad_w:
            x = F.pad(x, (left, pad_w - left))  # columns are local
        x = self.proj(x, pad_rows=(top, pad_h - top))  # (B, C', h'_r, W')
        hw = (x.shape[2], x.shape[3])
        x = x.flatten(2).transpose(1, 2)  # (B, N_r, C')
        norm = getattr(e, 'norm', None)
        if norm is not None:
            x = norm(x)
        return x, hw


class ShardedPositionEmbedding(nn.Module):
    """mmdet PVT's ``AbsolutePositionEmbedding``: ``x + band of interpolate(table, (H, W),
    bilinear)`` then its dropout; ``forward(x, hw_shape)`` with the local (h_r, W)."""

    def __init__(self, pos: nn.Module, group=None):
        super().__init__()
        self.pos = pos
        self.group = group

    def forward(self, x: torch.Tensor, hw_shape, mode: str = 'bilinear') -> torch.Tensor:
        p = self.pos
        (layout,) = row_offsets(hw_shape[0], group=self.group)
        ph, pw = p.pos_shape
        table = p.pos_embed[:, -ph * pw :].reshape(1, ph, pw, p.pos_dim).permute(0, 3, 1, 2)
        band = interpolate_full(table, layout, hw_shape[1], mode=mode, align_corners=False)
        return p.drop(x + band.flatten(2).transpose(1, 2))  # (B, h_r W, C)


class ShardedSRA(nn.Module):
    """mmdet's ``SpatialReductionAttention`` on a band: the stride-r reduction conv
    (``sr``) on the band, an ``all_gather`` of the reduced map (all keys when r = 1),
    its norm, then the same ``nn.MultiheadAttention`` with the local queries."""

    def __init__(self, attn: nn.Module, group=None):
        super().__init__()
        self.attn = attn
        self.group = group
        self.sr = ShardedConv2d(attn.sr, group=group) if attn.sr_ratio > 1 else None

    def forward(self, x: torch.Tensor, hw_shape, identity=None) -> torch.Tensor:
        m = self.attn
        kv = _nlc_to_nchw(x, hw_shape)  # (B, C, h_r, W)
        if self.sr is not None:
            kv = self.sr(kv)  # band of the (H/r, W/r) map, maybe empty
        kv = gather_rows(kv, group=self.group)  # (B, C, H', W') on every rank
        kv = kv.flatten(2).transpose(1, 2)  # (B, N', C)
        if self.sr is not None:
            kv = m.norm(kv)
        if identity is None:
            identity = x
        q = x
        if m.batch_first:
            q, kv = q.transpose(0, 1), kv.transpose(0, 1)
        out = m.attn(query=q, key=kv, value=kv)[0]
        if m.batch_first:
            out = out.transpose(0, 1)
        return identity + m.dropout_layer(m.proj_drop(out))


class GlobalShape(nn.Module):
    """``attn(x, (H, W))`` with the global H of the band whose local hw_shape the block
    passes (a sharded attention that takes the global map size, e.g.
    :class:`~mmcirc.parallel.circulant.ShardedCirculantAttention`)."""

    def __init__(self, attn: nn.Module, group=None):
        super().__init__()
        self.attn = attn
        self.group = group

    def forward(self, x: torch.Tensor, hw_shape) -> torch.Tensor:
        (layout,) = row_offsets(hw_shape[0], group=self.group)
        return self.attn(x, (layout.height, hw_shape[1]))


# --------------------------------------------------------------------------- VECA
class ShardedCorePeriphery(nn.Module):
    """VECA's ``CorePeripheryAttention`` on [cores; band of patches] (B, C' + n_r, D):
    the cores' softmax over the C' cores and all N patches as an exact reduction of
    per-rank (max, sum, weighted sum) (the core keys counted on rank 0), the patches'
    attention to the cores local. The cores' output is the same on every rank."""

    def __init__(self, attn: nn.Module, group=None):
        super().__init__()
        self.attn = attn
        self.group = group

    def forward(self, x, cos, sin, num_cores: int):
        from mmcirc.models.backbones.veca import Rotary2D

        a = self.attn
        if a.training and a.dropout > 0:
            raise ValueError('ShardedCorePeriphery: attention dropout in training is not supported')
        b, t, d = x.shape
        c = num_cores

        def heads(y):  # (B, T, D) -> (B, heads, T, d)
            return y.view(b, t, a.num_heads, a.head_dim).transpose(1, 2)

        q, k, v = heads(a.q_proj(x)), heads(a.k_proj(x)), heads(a.v_proj(x))
        cos, sin = cos.to(q.dtype).unsqueeze(1), sin.to(q.dtype).unsqueeze(1)
        q, k = Rotary2D.rotate(q, cos, sin), Rotary2D.rotate(k, cos, sin)
        rank = group_rank_size(self.group)[0]
        keys, vals = (k, v) if rank == 0 else (k[:, :, c:], v[:, :, c:])
        s = (q[:, :, :c] @ keys.transpose(-1, -2)) * a.head_dim**-0.5  # (B, h, C', T_r)
        if s.shape[-1]:
            m = s.amax(-1, keepdim=True)  # (B, h, C', 1)
        else:
            m = s.new_full(s.shape[:-1] + (1,), float('-inf'))
        gm = m.clone()
        dist.all_reduce(gm, op=dist.ReduceOp.MAX, group=self.group)
        e = torch.exp(s - gm)  # (B, h, C', T_r)
        acc = torch.cat([e.sum(-1, keepdim=True), e @ vals], dim=-1)  # (B, h, C', 1 + d)
        dist.all_reduce(acc, group=self.group)
        cores = acc[..., 1:] / acc[..., :1]  # (B, h, C', d)
        patches = F.scaled_dot_product_attention(q[:, :, c:], k[:, :, :c], v[:, :, :c])
        y = torch.cat([cores, patches], dim=2).transpose(1, 2).reshape(b, t, d)
        return a.out_drop(a.out_proj(y))


def veca_forward(model, x: torch.Tensor, embed: ShardedPatchEmbed, group=None) -> tuple:
    """:meth:`VECAViT.forward` on the band x (B, 3, h_r, W) of the image: the band's
    patches with the coordinates of their global rows; blocks with
    :class:`ShardedCorePeriphery` (swapped in by :func:`mmcirc.parallel.model.shard_model`)."""
    x, hw = embed(x)  # (B, n_r, D), (h_r, W')
    (layout,) = row_offsets(hw[0], group=group)
    b, c = x.shape[0], model._num_cores
    raw = model.core_coords[:c].unsqueeze(0).expand(b, -1, -1)  # (B, C', 2)
    grid = model.patch_coords((layout.height, hw[1]), x.device)  # (N, 2)
    grid = grid[layout.start * hw[1] : layout.stop * hw[1]]  # (n_r, 2)
    p_img = model.rope.augment(grid.unsqueeze(0).expand(b, -1, -1))
    x = torch.cat([model.cores[:c].unsqueeze(0).expand(b, -1, -1).to(x.dtype), x], dim=1)
    outs = []
    for i in range(model.num_layers):
        if i > 0:
            delta = model.pos_linears[i - 1](x[:, :c])  # (B, C', 2)
            raw = raw + model.pos_alpha[i - 1].to(delta.dtype) * delta
        cos, sin = model.rope.cos_sin(torch.cat([torch.tanh(raw), p_img], dim=1))
        x = model._call_block(model.blocks[i], x, cos, sin, c)
        if i in model.out_indices:
            y = model.output_proj(model.final_norm(x)) if i == model.num_layers - 1 else x
            outs.append(model._format(y[:, :c], y[:, c:], hw))
    return tuple(outs)
