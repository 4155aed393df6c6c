"""Circulant attention of a row-band-sharded map (METHOD.md section 4).

:class:`ShardedCirculantAttention` is :class:`~mmcirc.ops.circulant.CirculantAttention`
(same state dict) on the local band of tokens, rows ``band_bounds(H, P)[rank]``.

The equations are the single-process layer's own body, :func:`~mmcirc.ops.circulant.
attend`, set up by its :func:`~mmcirc.ops.circulant.circulant_plan` (once per input
shape) on the transforms of :class:`ShardedFFT`. Per block of heads:

1. gate, qkv: token-wise, local. qkv-in-spectrum: one :func:`sharded_rfft2` of x
   (B, C, h_r, W) -> column band (B, C, Ph, u_r), then ``W_q, W_k, W_v`` on it.
2. Eq. 15 on the column band (element-wise), :func:`sharded_irfft2` -> score band
   (B, heads, R_r, Pw) with R = H (``'circular'``) or Ph (``'zero'``, padding offsets
   masked), softmax with a global max and sum (two ``all_reduce`` of B x heads values).
3. :func:`sharded_rfft2` of p, Eq. 16 on the column band, :func:`sharded_irfft2` -> o
   (B, C, h_r, W); ``'zero'``: the row mass Z[i] = sum_m p[m] [i + m inside] is the same
   correlation with v = the map's indicator, whose spectrum is separable and computed
   locally, and one more inverse of its heads. Gate, proj local.

Backward: autograd through the same steps (the adjoint transposes of
:mod:`mmcirc.distributed.fft`, the softmax's sum by a differentiable ``all_reduce``),
the same traffic as the forward again.

Communication per forward, all ranks together (s bytes per real element of the compute
dtype; T(L, R): one transpose of L maps of R rows, :mod:`mmcirc.distributed.fft`)::

    T(B C, H) + 2 T(B heads, R) + T(B C, H) + z T(B heads, H)   (all_to_all_single)
    + 2 P B heads s                                          (two all_reduce payloads)

with R = H, z = 0 (``'circular'``) or R = Ph, z = 1 (``'zero'``). For d = 1
(heads = C): circular (U ~ W/2) about 4 s B C H W (1 - 1/P) bytes, i.e. 4 (1 - 1/P)
times the layer's input; zero (Ph ~ 2H, U ~ W) about 14 s B C H W (1 - 1/P)
(:func:`circulant_comm_bytes`: the exact figure).

Importing this module registers the handler of CirculantAttention.
"""

from functools import partial

import torch
import torch.distributed as dist

from mmcirc.ops.circulant import CirculantAttention, attend, circulant_plan, fft_grid, linear_cf
from mmcirc.ops.circulant_transforms import TorchFFT

from ..banded_map import BandedMap, ShardedOperator, operator_twin, refuse, register_operator
from ..comm import all_reduce_sum, empty_band, group_rank_size
from ..fft import sharded_irfft2, sharded_rfft2, spectrum_columns, transpose_bytes
from ..row_split import band_bounds

__all__ = ['ShardedCirculantAttention', 'circulant_banded', 'circulant_comm_bytes']


def circulant_comm_bytes(
    batch, channels, hw, world_size, num_heads=None, boundary='circular', real_bytes=4
):
    """Bytes all ranks send together in one :class:`ShardedCirculantAttention` forward
    (the transposes plus the two softmax ``all_reduce`` payloads, counted once per rank)."""
    h, w = hw
    heads = channels if num_heads is None else num_heads
    grid = fft_grid(h, w, boundary)
    r = h if boundary == 'circular' else grid[0]
    z = 0 if boundary == 'circular' else heads
    t = sum(
        transpose_bytes(batch * lead, rows, grid, world_size, real_bytes)
        for lead, rows in ((channels, h), (heads, r), (heads, r), (channels + z, h))
    )
    if world_size == 1:
        return 0
    return t + 2 * world_size * batch * heads * real_bytes


def _softmax_global(a, group):
    """Softmax over all offsets of the score bands a (B, heads, R_r, Pw) of every rank;
    differentiable (the max is a shift the softmax does not see: no gradient)."""
    if group_rank_size(group)[1] == 1:
        return torch.softmax(a.flatten(2), dim=-1).view_as(a)
    m = a.detach().amax(dim=(-2, -1), keepdim=True)  # (B, heads, 1, 1), -inf if masked
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    grad = torch.is_grad_enabled() and a.requires_grad
    e = torch.sub(a, m).exp() if grad else torch.sub(a, m).exp_()  # (B, heads, R_r, Pw)
    den = all_reduce_sum(e.sum(dim=(-2, -1), keepdim=True), group)  # (B, heads, 1, 1)
    return e / den if grad else e.div_(den)


def _valid_offset_rows(hw, grid, rows, device):
    """Rows ``[rows[0], rows[1])`` of the single-process offset mask (Ph, Pw): True
    where the wrapped index is an offset in [-(H-1), H-1] x [-(W-1), W-1]."""
    (h, w), (ph, pw) = hw, grid
    r = torch.arange(*rows, device=device)
    c = torch.arange(pw, device=device)
    return ((r < h) | (r > ph - h))[:, None] & ((c < w) | (c > pw - w))[None, :]


def _indicator_spectrum(hw, grid, cols, dtype, device):
    """Column band (Ph, u_r) of rfft2 of the H x W map's indicator on ``grid``
    (separable: FFT of H ones times the real FFT of W ones)."""
    ch = torch.fft.fft(torch.ones(hw[0], dtype=dtype, device=device), n=grid[0])  # (Ph,)
    cw = torch.fft.rfft(torch.ones(hw[1], dtype=dtype, device=device), n=grid[1])  # (U,)
    return ch[:, None] * cw[None, cols[0] : cols[1]]  # (Ph, u_r)


class ShardedFFT(TorchFFT):
    """The transforms of :func:`~mmcirc.ops.circulant.attend` on a row-band-sharded map
    (steps 1-3 above): real maps are the local row bands, spectra the local column bands.
    ``hw``: the global (H, W); ``dtype`` the compute dtype; the arguments of
    :func:`~mmcirc.ops.circulant_transforms.transforms` (``cpu`` unused) and ``group``."""

    def __init__(self, hw, boundary, dtype, device, cpu=False, group=None):
        super().__init__(hw, boundary)
        self.hw, self.group = tuple(hw), group
        rank, size = group_rank_size(group)
        self.padded = boundary == 'zero'  # the mask: the local rows of the offsets
        # the same blocks of heads on every rank (their collectives pair up): global sizes
        self.block_grid = (self.grid[0], self.grid[1] // size)
        self.cols = spectrum_columns(self.grid, size)[rank]
        if self.padded:
            r0, r1 = band_bounds(self.grid[0], size)[rank]
            self.valid = _valid_offset_rows(self.hw, self.grid, (r0, r1), device)  # (R_r, Pw)
            self.one = _indicator_spectrum(self.hw, self.grid, self.cols, dtype, device)

    def rfft2(self, x, norm='backward', rows=None):
        """The column band of the spectrum of the row band ``x`` of a map of ``rows``
        rows (None: the score grid's, Ph)."""
        return sharded_rfft2(x, self.grid[0] if rows is None else rows, self.grid, self.group, norm)

    def irfft2(self, y, hw, norm='backward'):
        return sharded_irfft2(y, hw[0], self.grid, hw[1], self.group, norm)  # (..., h_r, W)

    def mask(self, a, hw):
        return a.masked_fill(~self.valid, float('-inf')) if self.padded else a

    def softmax(self, a):
        return _softmax_global(a, self.group)

    def row_mass(self, p, pf, hw):
        return self.irfft2(pf * self.one, hw)  # (B, heads, h_r, W)


class ShardedCirculantAttention(ShardedOperator, CirculantAttention):
    """:class:`~mmcirc.ops.circulant.CirculantAttention` on the local row band of tokens
    (the arguments of :class:`~mmcirc.distributed.banded_map.ShardedOperator`): equal to
    the single-process layer on the assembled map up to float rounding; the torch.fft
    path only (no export mode)."""

    ARGS = ('dim', 'num_heads', 'boundary', 'scale')

    def _plan(self, x, hw_shape):
        """CirculantAttention's plan, kept also per rank and size of the group."""
        return super()._plan(x, hw_shape, group_rank_size(self.group))

    def _new_plan(self, x, hw_shape):
        """The input checks and the :func:`~mmcirc.ops.circulant.circulant_plan` of the
        local band x on :class:`ShardedFFT`."""
        rank, size = group_rank_size(self.group)
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f'x must be (B, N_local, {self.dim}), got {getattr(x, "shape", x)}')
        h, w = hw_shape
        r0, r1 = band_bounds(h, size)[rank]
        b, n, c = x.shape
        if n != (r1 - r0) * w:
            raise ValueError(
                f'x has N={n} tokens, but rank {rank} of {size} owns rows [{r0}, {r1}) of '
                f'hw_shape={tuple(hw_shape)} (the global map): {(r1 - r0) * w} tokens'
            )
        sharded = partial(ShardedFFT, group=self.group)
        return circulant_plan(
            x, (b, h * w, c), (h, w), self.num_heads, self.boundary, self.scale, sharded
        )

    def forward(self, x, hw_shape):
        """x (B, h_r W, C): the tokens (row-major) of rows ``band_bounds(H, P)[rank]``;
        hw_shape: the global (H, W). Returns the local band (B, h_r W, C)."""
        plan = self._plan(x, hw_shape)
        (b, n, c), (h, w), tf, cdt = x.shape, plan.hw, plan.tf, plan.cdt
        x = x.transpose(1, 2)  # (B, C, n)
        t = self.gate[1](linear_cf(self.gate[0], x))  # Eq. 20 gate (B, C, n)
        with plan.region:  # the qkv product in cdt (no plan.ldt) on the column band
            xs = tf.rfft2(x.to(cdt).reshape(b, c, n // w, w), plan.norms.fwd, rows=h)
            wqkv = self.qkv.weight.to(cdt).view(3, c, c)
            y = t.new_empty(t.shape)  # (B, C, n)
            xr = tf.operand(xs)  # (B, C, Ph, u_r, 2) real view of (B, C, Ph, u_r)
            for sl in plan.blocks:  # whole heads; the rows of W_q, W_k, W_v of this block
                wb = wqkv[:, sl].reshape(-1, c)  # (3 Cb, C)
                qkv = (  # (B, 3Cb, Ph, u_r); a rank may own no columns (U < P): then
                    # empty, its weights' gradient zero (every rank holds one)
                    tf.linear(wb, xr, cdt)
                    if xs.numel()
                    else empty_band(xs, (b, wb.shape[0], *xs.shape[2:])) + 0 * wb.sum()
                )
                o = attend(plan, *qkv.chunk(3, dim=1))  # (B, Cb, h_r, W)
                y[:, sl] = o.flatten(2).to(plan.odt) * t[:, sl]  # gate, (B, Cb, n)
        return self.proj_drop(linear_cf(self.proj, y, channels_last=True))


@register_operator(CirculantAttention)
def circulant_banded(module: CirculantAttention, x, hw_shape):
    """The :class:`~mmcirc.distributed.banded_map.BandedMap` handler of a CirculantAttention:
    tokens (B, N, C) banded by the rows of the global ``hw_shape`` -> the same band of
    its output, by a :class:`ShardedCirculantAttention` sharing the module's weights."""
    h, w = (int(v) for v in hw_shape)
    if not isinstance(x, BandedMap) or (x.band_dim, x.unit, x.height) != (1, w, h):
        raise refuse(
            'CirculantAttention',
            f'takes tokens (B, N, C) banded by the rows of hw_shape={tuple(hw_shape)}',
        )
    twin = operator_twin(module, ShardedCirculantAttention, x.group)
    return x.like(twin(x.local, (h, w)))  # (B, n_r, C)
