"""VECA on row bands: its block-sparse attention joins the C' cores to the patches
along the token axis, so the token map [cores; patches] is no row band and its forward
cannot run on a :class:`~mmcirc.distributed.banded.BandedMap`; the parts around it can.

* :class:`ShardedCorePeriphery`: VECA's ``CorePeripheryAttention`` on [cores; band of
  patches] (cores see every patch: the softmax over the patches of all ranks as a
  streaming max / sum reduction; patches see the cores: local);
* :func:`veca_forward`: :meth:`VECAViT.forward` with the patch embedding on the banded
  image and the patch coordinates of the band's global rows.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from mmcirc.distributed.comm import group_rank_size

__all__ = ['ShardedCorePeriphery', 'veca_forward']


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


def veca_forward(model, image) -> tuple:
    """:meth:`VECAViT.forward` on the banded image (a BandedMap (B, 3, H, W)): the
    band's patches with the coordinates of their global rows; blocks with
    :class:`ShardedCorePeriphery` (swapped in by :func:`mmcirc.parallel.model.shard_model`).
    Returns the local bands (B, C, h'_r, W') of the outputs."""
    p = model.patch_size
    if image.shape[-2] % p or image.shape[-1] % p:  # zero rows / columns at the bottom / right
        image = F.pad(image, (0, -image.shape[-1] % p, 0, -image.shape[-2] % p))
    fmap = model.patch_embed.proj(image)  # banded (B, D, H', W')
    hw = tuple(fmap.shape[-2:])
    tokens = model.patch_embed.norm(fmap.flatten(2).transpose(1, 2))  # banded (B, N, D)
    a, z = tokens.row_range
    x = tokens.local  # (B, n_r, D)
    b, c = x.shape[0], model._num_cores
    raw = model.core_coords[:c].unsqueeze(0).expand(b, -1, -1)  # (B, C', 2)
    grid = model.patch_coords(hw, x.device)[a * hw[1] : z * hw[1]]  # (n_r, 2)
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
            outs.append(model._format(y[:, :c], y[:, c:], (z - a, hw[1])))
    return tuple(outs)
