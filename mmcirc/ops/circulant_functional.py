"""Circulant attention of feature maps (:func:`circulant_attention`) and the attention
kernel a :class:`~mmcirc.ops.circulant.CirculantAttention` layer computes
(:func:`attention_kernel`, what the analysis captures): the one body of Eqs. 15-16 of
:mod:`mmcirc.ops.circulant` on q, k, v given as maps.

This file depends on torch only.
"""

import torch

from .circulant import (
    attend,
    check_num_heads,
    check_scale,
    circulant_plan,
    scores,
    transpose_tokens,
)
from .circulant_transforms import BOUNDARIES
from .settings import check_choice

__all__ = ['attention_kernel', 'circulant_attention']


def attention_kernel(layer, x, hw_shape):
    """The per-head kernel p = softmax(a) of a :class:`CirculantAttention` ``layer`` on
    tokens x (B, N, C) of an ``hw_shape`` map, by :func:`scores` (the layer's own body),
    in float32 (float64 for float64 x), indexed by offset m: (B, heads, H, W) by wrapped
    offset (``'circular'``), (B, heads, 2H-1, 2W-1) ordered by ``m + (H-1, W-1)``
    (``'zero'``)."""
    (b, _, c), (h, w) = x.shape, (int(v) for v in hw_shape)
    plan = circulant_plan(x, x.shape, (h, w), layer.num_heads, layer.boundary, layer.scale)
    tf, cdt = plan.tf, plan.cdt
    xs = tf.rfft2(transpose_tokens(x, cdt, plan.cpu).view(b, c, h, w), plan.norms.fwd)
    q, k = tf.linear(layer.qkv.weight.to(cdt)[: 2 * c], tf.operand(xs), cdt).chunk(2, dim=1)
    p = scores(plan, q, k)  # p[-m] (B, heads, Ph, Pw), from q, k (B, C, Ph, U)
    p = torch.roll(torch.flip(p, (-2, -1)), (1, 1), (-2, -1))  # p[m], index m mod P
    if layer.boundary == 'circular':
        return p
    p = torch.roll(p, (h - 1, w - 1), (-2, -1))  # ordered by m + (H-1, W-1)
    return p[..., : 2 * h - 1, : 2 * w - 1]  # the true offsets (a rounded-up grid: more)


def _check_maps(q, k, v):
    for name, t in (('q', q), ('k', k), ('v', v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(
                f'{name} must be a 4-D tensor (B, H, W, C), got {getattr(t, "shape", type(t))}'
            )
        if not t.is_floating_point():
            raise ValueError(f'{name} must be floating point, got {t.dtype}')
    if not q.shape == k.shape == v.shape:
        raise ValueError(
            f'q, k, v must have the same shape (B, H, W, C), '
            f'got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}'
        )
    if min(q.shape[1:]) < 1:
        raise ValueError(f'q, k, v need H, W, C >= 1, got {tuple(q.shape)}')


def circulant_attention(q, k, v, *, boundary='circular', num_heads=None, scale='sqrt_n'):
    """Circulant attention (Eqs. 15-16) of feature maps.

    Args:
        q, k, v (Tensor): (B, H, W, C), any H and W.
        boundary (str): ``'circular'`` (wrap-around, the paper) or ``'zero'``
            (no wrap-around, rows renormalised over in-map tokens).
        num_heads (int, optional): heads; the C/num_heads channels of a head
            share one score map and softmax. None: one head per channel (d=1).
        scale (str | float): ``'sqrt_n'`` (default, official code):
            s = 1/sqrt(N*d); ``'n'`` (paper Eq. 15, resolution invariant):
            s = 1/(N*sqrt(d)); or a positive float. N = H*W.

    Returns:
        Tensor: (B, H, W, C) in the input dtype (the autocast dtype under
        autocast); computed in float32 (float64 for float64 inputs).
    """
    _check_maps(q, k, v)
    check_choice('boundary', boundary, BOUNDARIES)
    b, h, w, c = q.shape
    heads = check_num_heads(c, num_heads)
    check_scale(scale)
    plan = circulant_plan(q, (b, h * w, c), (h, w), heads, boundary, scale)
    with plan.region:
        # (B, H, W, C) -> (B, C, H, W) contiguous: FFTs over contiguous last axes
        q, k, v = (
            transpose_tokens(t.reshape(b, h * w, c), plan.cdt, plan.cpu).view(b, c, h, w)
            for t in (q, k, v)
        )
        o = []
        for sl in plan.blocks:  # whole heads
            spectra = (plan.tf.rfft2(t[:, sl], plan.norms.fwd) for t in (q, k, v))
            o.append(attend(plan, *spectra))  # (B, Cb, H, W) from (B, Cb, Ph, U) each
        o = o[0] if len(o) == 1 else torch.cat(o, dim=1)  # (B, C, H, W)
    return transpose_tokens(o.reshape(b, c, h * w), plan.odt, plan.cpu).view(b, h, w, c)
