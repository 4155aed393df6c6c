"""VECA: the isotropic core-attention ViT of the official VECA repository
(github.com/alansong1322/VECA, ``veca/model.py``; METHOD.md 3.2).

This is the released architecture, a different operator from the sequential
gather-then-broadcast core attention of mmcirc's pyramids (METHOD.md 2). Per block,
on the sequence ``[cores (C'); patches (N)]``::

    q, k, v = LN(x) W_{q,k,v} + b           one projection set for cores and patches
    q, k    = RoPE2D(q, k; coordinates)     per head, 2-D rotary position
    cores'  = Attn(q_cores,   [k_cores; k_patches], [v_cores; v_patches])
    patches'= Attn(q_patches,  k_cores,              v_cores)        (parallel)
    x = x + [cores'; patches'] W_out + b
    x = x + fc2(silu(u) * v), (u, v) = fc1(LN(x))                   SwiGLU MLP

Cores are carried through all blocks; the first core is the global token, the
patches are the dense features; a final LN (and an optional output projection) ends
the model. Position: 2-D RoPE (base 100, a quarter of the head width per axis, the
lowest ``rope_p_zero_freqs`` of the frequencies switched off). Patch coordinates are
the grid centres in [-1, 1] (x then y); core coordinates are ``tanh`` of learned raw
coordinates, moved after every block by ``alpha_l * Linear_l(core tokens)``. During
training the patch coordinates are randomly shifted and rescaled (the official
augmentation, off in eval). Elastic inference: the first C' cores of the bank
(``num_cores`` / :meth:`VECAViT.set_num_cores`, a multiple of the chunk, 8).

Parameter names are the official ones except the core bank, which the official code
keeps in chunks of 8 (``query_token_chunks.{i}``, ``qcoord_chunks.{i}``) and mmcirc
as one tensor (``cores`` (C, D), ``core_coords`` (C, 2)); the converter
(``tools/model_converters/veca_to_mmcirc.py``) concatenates the chunks. Torch only
(see :mod:`.contract`).
"""

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..families import register_family
from .contract import (
    HAS_MMENGINE,
    BackboneContract,
    ElasticCores,
    call_block,
    check_images,
    check_positive_int,
    check_rate,
    is_int,
    pad_to_multiple,
    spatial_size,
)

__all__ = ['VECAViT', 'VECABlock', 'Rotary2D', 'VECA_OUT_TYPES']

#: ``featmap``: patches as (B, C, H, W) maps; ``global_token``: the first core (B, C);
#: ``featmap_and_token``: (map, token) pairs; ``raw``: (cores, patches) token tensors.
VECA_OUT_TYPES = ('featmap', 'global_token', 'featmap_and_token', 'raw')


class Rotary2D(nn.Module):
    """2-D rotary position embedding of the official VECA (per head of width ``head_dim``).

    The head is split in two halves, x then y; each half is ``head_dim // 4`` channel
    pairs rotated by ``2 pi * coord / period_f``, periods ``base ** (4 f / head_dim)``,
    f = 0 .. head_dim/4 - 1. A fraction ``p_zero_freqs`` of the periods (the longest,
    ``zero_freqs_from='low'``, or the shortest) are infinite: those pairs are not
    rotated. Pairs are adjacent channels (2i, 2i+1).
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 100.0,
        p_zero_freqs: float = 0.125,
        zero_freqs_from: str = 'low',
        shift_coords: Optional[float] = 0.08,
        jitter_coords: Optional[float] = None,
        rescale_coords: Optional[float] = 2.0,
    ):
        super().__init__()
        if not is_int(head_dim) or head_dim % 4:
            raise ValueError(f'head width must be a multiple of 4 for 2-D RoPE, got {head_dim!r}')
        if zero_freqs_from not in ('low', 'high'):
            raise ValueError(
                f"rope_zero_freqs_from must be 'low' or 'high', got {zero_freqs_from!r}"
            )
        self.head_dim, self.base = head_dim, float(base)
        self.shift_coords, self.jitter_coords = shift_coords, jitter_coords
        self.rescale_coords = rescale_coords
        self.p_zero_freqs, self.zero_freqs_from = float(p_zero_freqs), zero_freqs_from
        self.register_buffer('periods', self._periods(), persistent=False)

    def _periods(self, device=None) -> torch.Tensor:
        n = self.head_dim // 4
        periods = self.base ** (
            torch.arange(n, dtype=torch.float32, device=device) * 4 / self.head_dim
        )  # (n,)
        n_zero = int(round(self.p_zero_freqs * n))
        if n_zero:
            sl = slice(n - n_zero, n) if self.zero_freqs_from == 'low' else slice(0, n_zero)
            periods[sl] = float('inf')
        return periods

    def init_non_persistent_buffers(self) -> None:
        """``periods`` computed again (a function of the settings, not in checkpoints)."""
        self.periods = self._periods(self.periods.device)

    def augment(self, coords: torch.Tensor) -> torch.Tensor:
        """Training-time patch coordinate augmentation (B, N, 2); identity in eval."""
        if not self.training:
            return coords
        one = coords.new_empty
        if self.shift_coords is not None:
            coords = coords + one(2).uniform_(-self.shift_coords, self.shift_coords)
        if self.jitter_coords is not None:
            j = math.log(float(self.jitter_coords))
            coords = coords * one(2).uniform_(-j, j).exp()
        if self.rescale_coords is not None:
            r = math.log(float(self.rescale_coords))
            coords = coords * one(1).uniform_(-r, r).exp()
        return coords

    def cos_sin(self, coords: torch.Tensor):
        """coords (B, T, 2) (x, y) -> cos, sin (B, T, head_dim), float32."""
        freq = 2 * math.pi / self.periods.to(coords.device)  # (n,), 0 where the period is inf
        ang = coords.float().unsqueeze(-1) * freq  # (B, T, 2, n)
        ang = ang.repeat_interleave(2, dim=-1).flatten(-2)  # (B, T, 4n): x pairs, then y pairs
        return ang.cos(), ang.sin()

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, heads, T, d); cos / sin (B, 1, T, d): pairs (2i, 2i+1) rotated."""
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)  # (-x_{2i+1}, x_{2i})
        return x * cos + rot * sin


class CorePeripheryAttention(nn.Module):
    """Block-sparse attention over ``[cores; patches]``: cores see everything,
    patches see the cores only. Parameters ``{q,k,v,out}_proj`` (with biases)."""

    #: an attention layer for mmcirc.analysis (FLOPs; not captured: attention_form None)
    attention_kind = 'core_periphery'

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.dropout = float(dropout)
        self.out_drop = nn.Dropout(dropout)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
        """x (B, T, D), cos / sin (B, T, head_dim) -> q, k (rotated), v (B, heads, T, d)."""
        b, t = x.shape[:2]

        def heads(y):  # (B, T, D) -> (B, heads, T, d)
            return y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        cos, sin = cos.to(q.dtype).unsqueeze(1), sin.to(q.dtype).unsqueeze(1)  # (B, 1, T, d)
        return Rotary2D.rotate(q, cos, sin), Rotary2D.rotate(k, cos, sin), v

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_cores: int
    ) -> torch.Tensor:
        """x (B, C'+N, D), cos / sin (B, C'+N, head_dim) -> (B, C'+N, D)."""
        b, t, d = x.shape
        q, k, v = self.project(x, cos, sin)  # (B, h, C'+N, d) each
        p = self.dropout if self.training else 0.0
        c = num_cores
        cores = F.scaled_dot_product_attention(q[:, :, :c], k, v, dropout_p=p)  # (B, h, C', d)
        patches = F.scaled_dot_product_attention(q[:, :, c:], k[:, :, :c], v[:, :, :c], dropout_p=p)
        y = torch.cat([cores, patches], dim=2).transpose(1, 2).reshape(b, t, d)
        return self.out_drop(self.out_proj(y))


class VECABlock(nn.Module):
    """Pre-LN block: core-periphery attention and a SwiGLU MLP (hidden = int(D * ratio)).
    Names: ``norm_attn``, ``attn.*``, ``norm_ffn``, ``fc1`` (to 2 x hidden), ``fc2``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, dropout: float = 0.0):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm_attn = nn.LayerNorm(dim)
        self.attn = CorePeripheryAttention(dim, num_heads, dropout)
        self.norm_ffn = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, cos, sin, num_cores: int):
        x = x + self.attn(self.norm_attn(x), cos, sin, num_cores)
        u, v = self.fc1(self.norm_ffn(x)).chunk(2, dim=-1)
        return x + self.drop(self.fc2(self.drop(F.silu(u) * v)))


class VECAViT(ElasticCores, BackboneContract):
    """VECA backbone (official architecture) for mmpretrain, mmseg and mmdet.

    Args:
        arch (str | dict): an official family of ``arch_zoo`` (``'small'``, ``'splus'``,
            ``'base'``, ``'large'``) or a dict of its keys.
        patch_size (int): 16. in_channels (int): 3.
        patch_norm (bool): LN after the patch embedding (official default off).
        out_channels (int, optional): output projection width (the official
            ``distill_output_dim``; None: none).
        num_cores (int | str, optional): active C' (multiple of ``core_chunk``, or a
            preset in :data:`~mmcirc.ops.core.CORE_PRESETS`); None: all cores.
        core_chunk (int): the granularity of C' (official 8).
        out_indices (int | Sequence[int]): blocks whose patch outputs are returned.
        out_type (str): one of :data:`VECA_OUT_TYPES`.
        out_norm (bool): the last block's output through the final LN and output
            projection (the official output); False: raw, as the other blocks.
        rope_p_zero_freqs, rope_zero_freqs_from, rope_shift_coords,
            rope_jitter_coords, rope_rescale_coords: the official RoPE settings.
        dropout (float): the official dropout (attention, projection, MLP).
        with_cp (bool): gradient checkpointing of every block.
        frozen_stages (int): -1 none; 0 the patch embedding; k: also the first k
            blocks (with the core bank, coordinates and their heads); ``num_layers``:
            everything.
        init_cfg (dict, optional): mmengine init config.
    """

    family = 'veca'
    arch_zoo = {
        'small': dict(embed_dims=384, num_layers=12, num_heads=6, mlp_ratio=2.66667, num_cores=64),
        'splus': dict(embed_dims=384, num_layers=12, num_heads=6, mlp_ratio=4.0, num_cores=64),
        'base': dict(embed_dims=768, num_layers=12, num_heads=12, mlp_ratio=2.66667, num_cores=64),
        'large': dict(
            embed_dims=1024, num_layers=24, num_heads=16, mlp_ratio=2.66667, num_cores=64
        ),
    }
    arch_keys = ('embed_dims', 'num_layers', 'num_heads', 'mlp_ratio', 'num_cores')
    stage_unit = 'blocks'

    def __init__(
        self,
        arch='base',
        patch_size: int = 16,
        in_channels: int = 3,
        patch_norm: bool = False,
        out_channels: Optional[int] = None,
        num_cores=None,
        core_chunk: int = 8,
        out_indices=-1,
        out_type: str = 'featmap',
        out_norm: bool = True,
        rope_p_zero_freqs: float = 0.125,
        rope_zero_freqs_from: str = 'low',
        rope_shift_coords: Optional[float] = 0.08,
        rope_jitter_coords: Optional[float] = None,
        rope_rescale_coords: Optional[float] = 2.0,
        dropout: float = 0.0,
        with_cp: bool = False,
        frozen_stages: int = -1,
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        name = type(self).__name__
        s = self._parse_arch(arch)
        self.embed_dims, self.num_layers = s['embed_dims'], s['num_layers']
        self.num_heads, self.mlp_ratio = s['num_heads'], s['mlp_ratio']
        self.num_cores_max = s['num_cores']  # the bank; C' is checked once it is built
        if self.embed_dims % self.num_heads:
            raise ValueError(
                f'{name}: arch num_heads={self.num_heads} must divide embed_dims={self.embed_dims}'
            )
        if not is_int(core_chunk) or core_chunk < 1 or self.num_cores_max % core_chunk:
            raise ValueError(
                f'{name}: core_chunk must be a positive int dividing the bank size '
                f'{self.num_cores_max}, got {core_chunk!r}'
            )
        if out_type not in VECA_OUT_TYPES:
            raise ValueError(f'{name}: out_type must be one of {VECA_OUT_TYPES}, got {out_type!r}')
        if out_channels is not None and (not is_int(out_channels) or out_channels < 1):
            raise ValueError(
                f'{name}: out_channels must be None or a positive int, got {out_channels!r}'
            )
        check_rate(name, 'dropout', dropout)
        check_positive_int(name, 'patch_size', patch_size)
        check_positive_int(name, 'in_channels', in_channels)
        self._setup_contract(
            num_stages=self.num_layers,
            out_indices=out_indices,
            frozen_stages=frozen_stages,
            with_cp=with_cp,
        )
        self.core_chunk = self.num_cores_step = int(core_chunk)  # C' comes in chunks
        self.out_type = out_type
        self.out_norm = bool(out_norm)
        d = self.embed_dims
        self.out_channels = self.num_features = int(out_channels or d)

        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_channels, d, patch_size, stride=patch_size)
        self.patch_embed.norm = nn.LayerNorm(d) if patch_norm else nn.Identity()
        self.patch_size = int(patch_size)
        self.cores = nn.Parameter(torch.randn(self.num_cores_max, d) / math.sqrt(d))  # (C, D)
        self.core_coords = nn.Parameter(torch.zeros(self.num_cores_max, 2))  # raw (pre-tanh) (x, y)
        try:
            self.rope = Rotary2D(
                d // self.num_heads,
                100.0,
                rope_p_zero_freqs,
                rope_zero_freqs_from,
                rope_shift_coords,
                rope_jitter_coords,
                rope_rescale_coords,
            )
        except ValueError as err:
            raise ValueError(f'{name}: {err}') from None
        self.pos_linears = nn.ModuleList([nn.Linear(d, 2) for _ in range(self.num_layers - 1)])
        self.pos_alpha = nn.Parameter(torch.full((self.num_layers - 1,), 0.01))
        self.blocks = nn.ModuleList(
            [VECABlock(d, self.num_heads, self.mlp_ratio, dropout) for _ in range(self.num_layers)]
        )
        self.final_norm = nn.LayerNorm(d)
        self.output_proj = (
            nn.Identity() if self.out_channels == d else nn.Linear(d, self.out_channels)
        )
        self._setup_cores(num_cores, self.num_cores_max)
        self._freeze_stages()

    def _frozen_parts(self):
        """``frozen_stages`` = k: the patch embedding; k >= 1 also the core bank, its
        coordinates and their heads up to block k; all: everything (and the RoPE
        coordinate augmentation off)."""
        k, modules, params = self.frozen_stages, [], []
        if k >= 0:
            modules.append(self.patch_embed)
        if k >= 1:
            params += [p for p in (self.cores, self.core_coords, self.pos_alpha) if p is not None]
            modules += list(self.blocks[:k]) + list(self.pos_linears[: k - 1])
        if k == self.num_layers:
            modules += list(self.pos_linears) + [self.final_norm, self.output_proj, self.rope]
        return modules, params

    def init_weights(self):
        """The official init (truncated normal std 0.02 linears and patch conv, zero
        biases, unit norms; the bank ~ randn / sqrt(D), the core coordinates
        atanh of farthest-point samples in [-0.95, 0.95]^2), then ``init_cfg``."""
        if not getattr(self, 'is_init', False):
            nn.init.trunc_normal_(self.patch_embed.proj.weight, std=0.02)
            nn.init.zeros_(self.patch_embed.proj.bias)
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
            with torch.no_grad():
                self.cores.normal_().div_(math.sqrt(self.embed_dims))
                self.core_coords.copy_(_fps_coords(self.num_cores_max))
                self.pos_alpha.fill_(0.01)
        super().init_weights()

    @staticmethod
    def patch_coords(hw: Sequence[int], device) -> torch.Tensor:
        """Grid centres of an H x W patch map in [-1, 1], (H*W, 2) as (x, y), row-major."""
        h, w = hw
        y = (torch.arange(h, device=device, dtype=torch.float32) + 0.5) * (2.0 / h) - 1
        x = (torch.arange(w, device=device, dtype=torch.float32) + 0.5) * (2.0 / w) - 1
        return torch.stack([x.expand(h, w), y[:, None].expand(h, w)], dim=-1).reshape(h * w, 2)

    def _format(self, cores, patches, hw):
        if self.out_type == 'raw':
            return cores, patches  # (B, C', D), (B, N, D)
        token = cores[:, 0]  # (B, D): the global token
        if self.out_type == 'global_token':
            return token
        b, n, d = patches.shape
        fmap = patches.transpose(1, 2).reshape(b, d, *hw).contiguous()  # (B, D, H, W)
        return fmap if self.out_type == 'featmap' else (fmap, token)

    def forward(self, x: torch.Tensor) -> tuple:
        """x (B, in_channels, H, W), zero padded at the bottom / right to multiples of the
        patch size. Returns one output per ``out_indices`` entry, shaped by ``out_type``
        (the last block's through ``out_norm``)."""
        check_images(type(self).__name__, x)
        x = self.patch_embed.proj(pad_to_multiple(x, self.patch_size))  # (B, D, H, W)
        b, hw = x.shape[0], spatial_size(x)  # ints eagerly, symbolic under torch.export
        x = self.patch_embed.norm(x.flatten(2).transpose(1, 2))  # (B, N, D)
        c = self._num_cores
        raw = self.core_coords[:c].unsqueeze(0).expand(b, -1, -1)  # (B, C', 2)
        p_img = self.rope.augment(self.patch_coords(hw, x.device).unsqueeze(0).expand(b, -1, -1))
        x = torch.cat(
            [self.cores[:c].unsqueeze(0).expand(b, -1, -1).to(x.dtype), x], dim=1
        )  # (B, C'+N, D)
        outs = []
        for i in range(self.num_layers):
            if i > 0:  # move the core coordinates with the previous block's cores
                delta = self.pos_linears[i - 1](x[:, :c])  # (B, C', 2)
                raw = raw + self.pos_alpha[i - 1].to(delta.dtype) * delta
            cos, sin = self.rope.cos_sin(torch.cat([torch.tanh(raw), p_img], dim=1))  # (B, C'+N, d)
            block = self.blocks[i]
            x = call_block(block, x, cos, sin, c) if self.with_cp else block(x, cos, sin, c)
            if i in self.out_indices:
                last = i == self.num_layers - 1 and self.out_norm
                y = self.output_proj(self.final_norm(x)) if last else x
                outs.append(self._format(y[:, :c], y[:, c:], hw))
        return tuple(outs)


def _fps_coords(num: int, pool: int = 1000, coord_range: float = 0.95) -> torch.Tensor:
    """Raw core coordinates: atanh of ``num`` farthest-point samples (the first the
    closest to the centre) from ``pool`` uniform points in [-range, range]^2."""
    pts = torch.empty(pool, 2).uniform_(-coord_range, coord_range)
    if num < pool:
        idx = [int((pts**2).sum(1).argmin())]
        dist = ((pts - pts[idx[0]]) ** 2).sum(1)
        for _ in range(1, num):
            idx.append(int(dist.argmax()))
            dist = torch.minimum(dist, ((pts - pts[idx[-1]]) ** 2).sum(1))
        pts = pts[idx]
    return torch.atanh(pts.clamp(-0.999, 0.999))


register_family(VECAViT)
if HAS_MMENGINE:
    from mmcirc.registry import register_model

    register_model(VECAViT)
