"""Circulant attention (METHOD.md section 1; Han et al., arXiv 2512.21542).

Per head (``d`` channels sharing one score map), with ``s`` the scale::

    a[m] = s * sum_i sum_{c in head} q[i, c] k[i (+) m, c]    (Eq. 15)
    p    = softmax over the offsets m of a
    o[i] = sum_m p[m] v[i (+) m]                             (Eq. 16)

The attention matrix ``A[i, j] = p[j (-) i]`` is block-circulant (BCCB), so
both sums are 2-D cross-correlations and cost O(N log N) with FFTs:
``FFT(a) = s * sum_c conj(Q_c) K_c`` and ``FFT(o) = conj(P) V``.

Two boundary modes:

* ``'circular'`` (the paper): ``(+)`` wraps around the H x W map; FFTs on
  H x W.
* ``'zero'``: no wrap-around. Offsets m lie in [-(H-1), H-1] x [-(W-1), W-1],
  ``a[m]`` sums only pairs inside the map, the softmax runs over these
  (2H-1)(2W-1) offsets, ``o[i]`` sums only over ``i + m`` inside the map and
  is divided by ``Z[i] = sum_m p[m] [i + m inside]``. The FFTs run on a
  zero-padded grid of at least (2H-1) x (2W-1) (rounded up to a 5-smooth
  length), on which the circular correlation of the padded maps does not
  alias.

Every FFT and the softmax run in float32 (float64 for float64 inputs) with
autocast disabled; the result is cast back to the autocast / input dtype. Under
autocast the gate and output projection run in the autocast dtype, and in the CPU
layout (:mod:`mmcirc.ops.settings`) so does the qkv product on the float32 spectrum
under bf16.

One body of the equations (:func:`scores`, :func:`attend`), set up by one
:class:`CirculantPlan` (:func:`circulant_plan`, once per input shape), for every transform
backend (:mod:`mmcirc.ops.circulant_transforms`: torch.fft, or real matmul DFTs with
symbolic sizes inside :func:`~mmcirc.ops.settings.export_mode`; the row-band-sharded transforms of
:mod:`mmcirc.distributed.handlers.circulant`), for the functional form and the probe
(:mod:`mmcirc.ops.circulant_functional`).

This file depends on torch only.
"""

from __future__ import annotations

import contextlib
import math
from numbers import Real
from typing import Any, NamedTuple

import torch
from torch import nn

from .circulant_kernel import CoreArgs, kernel_refusal, layer_core, pack_weights, report_torch_path
from .circulant_transforms import BOUNDARIES, fft_grid, next_fast_len, transforms
from .settings import (
    autocast_dtype,
    cached_plan,
    check_choice,
    cpu_layout,
    default_kernel,
    graph_capture,
)

__all__ = [
    'BOUNDARIES', 'SCALES', 'CirculantAttention', 'CirculantPlan', 'SpectralNorms', 'attend',
    'check_num_heads', 'check_scale', 'circulant_plan', 'compute_dtypes', 'fft_grid',
    'fp32_region', 'head_blocks', 'linear_cf', 'next_fast_len', 'scale_value', 'scores',
    'spectral_norms', 'transpose_tokens',
]  # fmt: skip

SCALES = ('sqrt_n', 'n')


def check_num_heads(channels, num_heads):
    """Validate ``num_heads`` of ``channels`` (None = one head per channel); return it."""
    if num_heads is None:
        return channels
    if (
        isinstance(num_heads, bool)
        or not isinstance(num_heads, int)
        or num_heads < 1
        or channels % num_heads
    ):
        raise ValueError(
            f'num_heads must be None or a positive int dividing '
            f'the channel count {channels}, got {num_heads!r}'
        )
    return num_heads


def check_scale(scale):
    """The one check of a circulant ``scale``: ``'sqrt_n'``, ``'n'`` or a positive finite
    float (ValueError otherwise)."""
    ok = (
        scale in SCALES
        if isinstance(scale, str)
        else isinstance(scale, Real)
        and not isinstance(scale, bool)
        and math.isfinite(scale)
        and scale > 0
    )
    if not ok:
        raise ValueError(f"scale must be 'sqrt_n', 'n' or a positive float, got {scale!r}")


def scale_value(scale, n, d):
    """s for N = n real tokens and head width d (METHOD.md, 'Scale'); ``n`` may be a
    symbolic size (torch.export); ``scale`` checked by :func:`check_scale`."""
    if scale == 'sqrt_n':  # official code (d = 1: 1/sqrt(N))
        return 1.0 / math.sqrt(n * d) if isinstance(n, int) else (n * d) ** -0.5
    if scale == 'n':
        return 1.0 / (n * math.sqrt(d))  # paper Eq. 15, resolution invariant
    return float(scale)


def compute_dtypes(t):
    """(compute dtype, output dtype) for an input tensor ``t``."""
    if t.dtype == torch.float64:
        return torch.float64, torch.float64
    return torch.float32, autocast_dtype(t.device.type) or t.dtype


def fp32_region(t):
    """Context with autocast off on ``t``'s device (FFTs need fp32): a no-op when
    autocast is off already (torch.export turns even a disabled autocast region into a
    ``wrap_with_autocast`` subgraph, whose symbolic sizes the ONNX translation mixes up)."""
    if autocast_dtype(t.device.type) is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=t.device.type, enabled=False)


def transpose_tokens(x, dtype=None, cpu=False):
    """Contiguous ``x.transpose(1, 2)`` of x (B, P, Q) -> (B, Q, P), cast to ``dtype``.

    With ``cpu`` (the CPU layout of :mod:`mmcirc.ops.settings`) one 2-D transpose per batch element,
    after the cast: torch's CPU ``copy_`` has a blocked kernel for a 2-D transpose within
    one dtype only, and the 3-D transpose copy is several times slower. Beware that
    ``x.transpose(1, 2).to(memory_format=torch.contiguous_format)`` copies nothing for a
    3-D tensor (torch aliases it), and an FFT over such a strided view is far slower.
    The CUDA layout, and symbolic batch sizes (torch.export), take one plain copy.
    """
    x = x if dtype is None else x.to(dtype)  # elementwise on the contiguous layout
    b, p, q = x.shape
    if not cpu or not isinstance(b, int):
        return x.transpose(1, 2).contiguous()
    out = x.new_empty(b, q, p)  # (B, Q, P)
    for i in range(b):
        out[i].copy_(x[i].t())  # (Q, P) <- (P, Q)^T
    return out


BLOCK_BYTES = 1 << 23  # CPU: spectra of one block of heads ~8 MiB (cache)
#: at most this many blocks: each block's qkv product reads the spectrum of all C
#: input channels, so n blocks read it n times
MAX_HEAD_BLOCKS = 8


def head_blocks(channels, num_heads, grid, batch=1, cpu=True):
    """Channel slices of whole heads: one block of all heads unless ``cpu`` (the CPU
    layout of :mod:`mmcirc.ops.settings`), where each block's q/k/v spectra are about
    BLOCK_BYTES and there are at most MAX_HEAD_BLOCKS blocks.

    Heads are independent. On the CPU, blocks keep every FFT and product in cache; on a
    GPU, blocks only multiply the kernels launched. On maps whose heads do not fit the
    budget the CPU blocks grow instead to a MAX_HEAD_BLOCKS-th of the heads.
    """
    if not cpu:
        return [slice(0, channels)]
    d = channels // num_heads
    per_head = 3 * batch * d * grid[0] * (grid[1] // 2 + 1) * 8  # q, k, v
    heads = max(1, min(num_heads, BLOCK_BYTES // per_head), -(-num_heads // MAX_HEAD_BLOCKS))
    step = d * heads
    return [slice(i, min(i + step, channels)) for i in range(0, channels, step)]


class SpectralNorms(NamedTuple):
    """The normalisations of a plan's transforms (:func:`spectral_norms`)."""

    fwd: str  #: the ``norm`` of the spectra of q, k, v
    score: str  #: the scores a = r * irfft2(corr, norm=score)
    r: float | None  #: None: no product
    out: str  #: o = irfft2(P' V, norm=out)


def spectral_norms(tf, scale, n, d):
    """How Eq. 15's scale s rides on the transforms' normalisations, for :func:`attend`
    (:class:`SpectralNorms`).

    With ``fwd = 'ortho'`` on a grid of G = Ph Pw cells, Q' K'* = Q K* / G, so Eq. 15's
    s (1/G) sum = s sum over Q' K'*: an inverse of factor f (``'ortho'`` 1/sqrt(G),
    ``'backward'`` 1/G, ``'forward'`` 1) leaves r = s / f. The circular grid is the map
    (G = N), so ``'sqrt_n'`` (s = 1/sqrt(N d)) takes the ``'ortho'`` inverse and ``'n'``
    (s = 1/(N sqrt(d))) the ``'backward'`` one with r = 1/sqrt(d): no product for d = 1;
    a float s takes the ``'forward'`` inverse with r = s. Eq. 16's 1/G = (1/sqrt(G))
    (1/sqrt(G)) with V' = V / sqrt(G) is an ``'ortho'`` inverse. The choice depends on
    the settings, not on the sizes, so eager and compiled graphs compute alike and
    symbolic sizes (dynamic shapes) need no Python decision. Export's matmul DFTs keep
    unnormalised spectra and r = s.
    """
    if tf.symbolic:  # export's matmul DFTs: unnormalised spectra, the product by s
        return SpectralNorms('backward', 'backward', scale_value(scale, n, d), 'backward')
    if not isinstance(scale, str):
        return SpectralNorms('ortho', 'forward', float(scale), 'ortho')
    g = tf.grid[0] * tf.grid[1]
    if scale == 'sqrt_n':  # f = 1/sqrt(G): r = s sqrt(G) = sqrt(G / (N d))
        r = (None if d == 1 else d**-0.5) if tf.circular else (g / (n * d)) ** 0.5
        return SpectralNorms('ortho', 'ortho', r, 'ortho')
    r = (None if d == 1 else d**-0.5) if tf.circular else g / (n * d**0.5)  # 'n', f = 1/G
    return SpectralNorms('ortho', 'backward', r, 'ortho')


class CirculantPlan(NamedTuple):
    """What a forward decides once per input shape (:func:`circulant_plan`): the set-up of
    the one body of Eqs. 15-16 (:func:`attend`)."""

    tf: Any  #: the transforms (:func:`~mmcirc.ops.circulant_transforms.transforms`)
    hw: tuple[int, int]  #: the (global) map (H, W)
    d: int  #: head width
    norms: SpectralNorms
    blocks: list  #: channel slices of whole heads (:func:`head_blocks`)
    cdt: torch.dtype  #: compute dtype of the FFTs and the softmax
    odt: torch.dtype  #: output dtype
    ldt: torch.dtype | None  #: the qkv product's dtype on the spectrum (None: cdt)
    cpu: bool  #: the CPU layout (:mod:`mmcirc.ops.settings`)
    region: Any  #: :func:`fp32_region` of the input
    core: CoreArgs | None = None  #: the Triton kernel's arguments where it runs the core


def circulant_plan(t, shape, hw, num_heads, boundary, scale, make_transforms=transforms):
    """The :class:`CirculantPlan` of an input ``t`` of tokens ``shape`` (B, N, C) on an
    ``hw`` map with ``num_heads``, ``boundary`` and ``scale`` (checked by the caller);
    ``make_transforms(hw, boundary, dtype, device, cpu)`` makes its transforms."""
    b, n, c = shape
    d = c // num_heads
    cdt, odt = compute_dtypes(t)
    cpu = cpu_layout(t)
    # in the CPU layout the qkv product on the spectrum runs in bf16 when the layer's
    # output is (autocast): a linear like the gate and proj; bf16 has float32's range
    # (fp16 could overflow on the spectrum's DC term, ~N times a token), the FFTs stay
    # float32. The CUDA layout keeps it float32: no cast of the spectrum either way.
    ldt = torch.bfloat16 if odt == torch.bfloat16 and cpu else None
    tf = make_transforms(hw, boundary, cdt, t.device, cpu)
    norms = spectral_norms(tf, scale, n, d)
    # one block when the sizes are symbolic (export: no Python decision on them)
    blocks = [slice(0, c)] if tf.symbolic else head_blocks(c, num_heads, tf.block_grid, b, cpu)
    return CirculantPlan(tf, tuple(hw), d, norms, blocks, cdt, odt, ldt, cpu, fp32_region(t))


def scores(plan, q, k):
    """Eq. 15 and the softmax from the spectra (B, C, Ph, U) of q, k made with
    ``norm=plan.norms.fwd`` by the transforms of a :class:`CirculantPlan`: p' (B, heads,
    Ph, Pw), the attention kernel at the negated offsets, p'[m] = p[-m].

    Sign convention (the one of every path: single process, sharded, probe, export): the
    scores are kept at the negated offsets, a'[m] = a[-m], whose spectrum is FFT(a') =
    s sum_{c in head} Q_c conj(K_c) (Eq. 15 conjugated; a softmax over all offsets does
    not care about their order), so that FFT(p') = conj(P) is Eq. 16's factor as it
    stands (:func:`attend`): one conjugate per layer.
    """
    tf, r = plan.tf, plan.norms.r
    a = tf.irfft2(tf.corr(q, k, plan.d), tf.grid, plan.norms.score)  # a' (B, heads, Ph, Pw)
    a = a if r is None else a * r  # Eq. 15's scale where no normalisation carries it
    # 'zero' on a grid rounded up: softmax only over the true offsets (Z would cancel
    # the padding's share anyway; the mask keeps the softmax max over real offsets, so
    # their p cannot underflow)
    return tf.softmax(tf.mask(a, plan.hw) if tf.padded else a)  # p' (B, heads, Ph, Pw)


def attend(plan, q, k, v):
    """Eq. 15, softmax (:func:`scores`), Eq. 16 from the spectra (B, C, Ph, U) of q, k, v
    made with ``norm=plan.norms.fwd`` by the transforms of a :class:`CirculantPlan`.
    Returns o (B, C, H, W)."""
    (b, c), tf, hw, d = q.shape[:2], plan.tf, plan.hw, plan.d
    p = scores(plan, q, k)  # p' = p[-m] (B, heads, Ph, Pw)
    # Eq. 16: FFT(o) = conj(P) V = FFT(p') V, per channel of the head
    pf = tf.rfft2(p)  # FFT(p') (B, heads, Ph, U)
    o = tf.irfft2(tf.apply(pf, v, d), hw, plan.norms.out)  # (B, C, H, W)
    if not tf.circular:  # 'zero': renormalise rows of A over in-map tokens
        z = tf.row_mass(p, pf, hw).unsqueeze(2)  # (B, heads, 1, H, W)
        o = (o.view(b, c // d, d, *o.shape[-2:]) / z).view(o.shape)  # (B, C, H, W)
    return o


def linear_cf(layer, x, channels_last=False):
    """nn.Linear ``layer`` on channels-first x (B, C_in, N), without copies: (B, C_out, N),
    or (B, N, C_out) with ``channels_last``."""
    b = x.shape[0]
    w = layer.weight.expand(b, -1, -1)  # (B, C_out, C_in)
    if channels_last:  # (B, N, C_in) @ (B, C_in, C_out)
        x, w = x.transpose(1, 2), w.transpose(1, 2)
        return torch.baddbmm(layer.bias, x, w) if layer.bias is not None else torch.bmm(x, w)
    return torch.baddbmm(layer.bias[:, None], w, x) if layer.bias is not None else torch.bmm(w, x)


class CirculantAttention(nn.Module):
    """The official circulant attention layer (CA-DeiT), for any H x W.

    ``y = proj(CA(x W_q, x W_k, x W_v) * SiLU(gate(x)))`` where the bias-free
    qkv projection is applied to the spectrum of x (one FFT instead of three:
    FFT(x W) = FFT(x) W for a real W; with ``boundary='zero'`` this holds on
    the zero-padded grid too, because padding commutes with the projection),
    so it equals projecting q, k, v and calling :func:`circulant_attention`.
    Parameter names match the official code (``gate.0``, ``qkv``, ``proj``);
    the tokens are transposed once to channels first (the layout of the FFTs),
    the gate runs on that layout and the output projection reads it as a
    transposed operand.

    Args:
        dim (int): channels C.
        num_heads, boundary, scale: see :func:`circulant_attention`.
        proj_drop (float): dropout after the output projection.
        kernel (str, optional): ``'torch'`` (the FFT path) or ``'triton'`` (the core as one
            Triton kernel where it applies, :mod:`mmcirc.ops.circulant_kernel`; where it
            does not, one warning per map size says why); None: the environment's
            ``MMCIRC_KERNEL``, else ``'torch'``.
    """

    def __init__(
        self,
        dim,
        num_heads=None,
        boundary='circular',
        scale='sqrt_n',
        proj_drop=0.0,
        kernel=None,
    ):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f'dim must be a positive int, got {dim!r}')
        check_choice('boundary', boundary, BOUNDARIES)
        check_scale(scale)
        self.kernel = default_kernel(kernel)
        self.dim = dim
        self.num_heads = check_num_heads(dim, num_heads)
        self.boundary = boundary
        self.scale = scale
        self.gate = nn.Sequential(nn.Linear(dim, dim), nn.SiLU())  # Eq. 20
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self._plans = {}  # see _plan

    def extra_repr(self):
        kernel = '' if self.kernel == 'torch' else f', kernel={self.kernel!r}'
        return (
            f'dim={self.dim}, num_heads={self.num_heads}, '
            f'boundary={self.boundary!r}, scale={self.scale!r}{kernel}'
        )

    def train(self, mode=True):
        """nn.Module's; switching to eval mode with ``kernel='triton'`` packs the qkv and
        gate weights for inference (:func:`pack_weights`)."""
        super().train(mode)
        if not mode and self.kernel == 'triton':
            pack_weights(self)
        return self

    def _new_plan(self, x, hw_shape):
        """The input checks and :func:`circulant_plan` of this input, with ``core`` the
        Triton kernel's arguments where it runs the core (:func:`layer_core`)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(
                f'x must be a 3-D tensor (B, N, C), got {getattr(x, "shape", type(x))}'
            )
        if x.shape[-1] != self.dim:
            raise ValueError(f'x must have dim={self.dim} channels, got {x.shape[-1]}')
        if (
            not isinstance(hw_shape, (tuple, list))
            or len(hw_shape) != 2
            or not all(
                isinstance(n, (int, torch.SymInt)) and not isinstance(n, bool) and n >= 1
                for n in hw_shape
            )
        ):
            raise ValueError(f'hw_shape must be (H, W) with positive ints, got {hw_shape!r}')
        n, (h, w) = x.shape[1], hw_shape
        if n != h * w:
            raise ValueError(f'x has N={n} tokens but hw_shape={tuple(hw_shape)} gives H*W={h * w}')
        plan = circulant_plan(x, x.shape, (h, w), self.num_heads, self.boundary, self.scale)
        why = kernel_refusal(x, (h, w), self.boundary) if self.kernel == 'triton' else None
        if self.kernel == 'triton' and why is None:
            s = scale_value(self.scale, n, plan.d)
            plan = plan._replace(core=CoreArgs(h, w, self.num_heads, self.boundary == 'zero', s))
        elif why is not None:  # one warning per layer shape and reason
            report_torch_path(self, (h, w), why)
        return plan

    def _plan(self, x, hw_shape, *key):
        """:meth:`_new_plan`, kept per input shape, dtype, device, autocast dtype and ``key``
        for eager calls on the CPU or CUDA (:func:`~mmcirc.ops.settings.cached_plan`); made
        anew in a captured graph (symbolic sizes) and on other devices."""
        dev = getattr(getattr(x, 'device', None), 'type', None)
        if dev not in ('cpu', 'cuda') or type(hw_shape) not in (tuple, list) or graph_capture():
            return self._new_plan(x, hw_shape)
        key += (x.shape, tuple(hw_shape), x.dtype, x.device, autocast_dtype(dev))
        return cached_plan(self._plans, key, lambda: self._new_plan(x, hw_shape))

    def forward(self, x, hw_shape):
        """x: (B, N, C) tokens of an H x W map (row-major), hw_shape = (H, W).
        Returns (B, N, C)."""
        plan = self._plan(x, hw_shape)
        if plan.core is not None:  # the opt-in Triton kernel: gate and qkv linear, core, proj
            return self.proj_drop(self.proj(layer_core(self, x, plan.core)))
        (b, n, c), (h, w), tf, cdt = x.shape, plan.hw, plan.tf, plan.cdt
        x = transpose_tokens(x, cpu=plan.cpu)  # (B, C, N) contiguous: channels first from here on
        t = self.gate[1](linear_cf(self.gate[0], x))  # Eq. 20 gate (B, C, N)
        with plan.region:  # autocast off around the FFTs (a no-op without autocast)
            wqkv = self.qkv.weight.to(cdt).view(3, c, c)  # W_q, W_k, W_v
            # FFT(x W) = FFT(x) W: a real weight commutes with the FFT, and
            # with the zero padding of boundary='zero' (grid > H x W)
            x = tf.rfft2(x.to(cdt).view(b, c, h, w), plan.norms.fwd)  # (B, C, Ph, U)
            x = tf.operand(x, plan.ldt)  # its real view (B, C, Ph, U, 2)
            y = []
            for sl in plan.blocks:  # whole heads; the rows of W_q, W_k, W_v of this block
                q, k, v = tf.linear(wqkv[:, sl].reshape(-1, c), x, cdt).chunk(3, dim=1)
                o = attend(plan, q, k, v)  # (B, Cb, H, W)
                y.append(o.reshape(b, -1, n).to(plan.odt) * t[:, sl])  # gate, (B, Cb, N)
            y = y[0] if len(y) == 1 else torch.cat(y, dim=1)  # (B, C, N)
        return self.proj_drop(linear_cf(self.proj, y, channels_last=True))
