"""The softmax of core attention over its few cores, and what makes it fast on the CPU
(:class:`~mmcirc.ops.core.CoreAttention`'s folded broadcast; measured in
docs/benchmarks.md).

* :func:`core_softmax`: over C' < ``SOFTMAX_WIDTH`` cores the softmax runs over scores
  padded with -inf to one vector of floats of torch's CPU kernels (the padded weights
  are exactly 0 and dropped before the value product): a softmax over a last axis
  shorter than one vector costs more per element.
* :func:`pad_keys`: the keys of the fused attention of one head, padded likewise.
* :class:`Scores`: the scores' GEMM with a key gradient that MKL runs well for any C'.

Traced, compiled and exported graphs (the FLOP count, torch.compile, ONNX) keep the
plain softmax and GEMMs: the padding is a CPU kernel's speed, not part of the method.
Under bf16 / fp16 autocast the softmax runs in float32 (:func:`wide`).

This file depends on torch only.
"""

import torch
import torch.nn.functional as F

from .settings import cpu_layout, graph_capture

__all__ = ['SOFTMAX_WIDTH', 'Scores', 'core_softmax', 'pad_keys', 'wide']

#: the folded broadcast's softmax runs over at least this many scores per head: one vector
#: of floats of torch's CPU kernels (16 with AVX-512, 8 with AVX2 and the others); fewer
#: active cores are padded with -inf (weight 0)
SOFTMAX_WIDTH = 16 if torch.backends.cpu.get_cpu_capability() == 'AVX512' else 8


def wide(t):
    """``t`` in float32 when it is bf16 / fp16 (scores under autocast: softmax and its
    sums run in float32, METHOD.md), else unchanged (float32 and float64 stay)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def core_softmax(s):
    """Softmax over the last axis of scores ``s`` (..., C') (the cores), in float32 at
    least; in the CPU layout padded to ``SOFTMAX_WIDTH`` (module docstring), not in
    captured graphs. Returns (..., C') (a strided view when padded)."""
    nc = s.shape[-1]
    s = wide(s)
    if nc >= SOFTMAX_WIDTH or graph_capture() or not cpu_layout(s):
        return torch.softmax(s, dim=-1)
    s = F.pad(s, (0, SOFTMAX_WIDTH - nc), value=float('-inf'))  # (..., SOFTMAX_WIDTH)
    return torch.softmax(s, dim=-1)[..., :nc]  # (..., C')


def pad_keys(k, v, beta):
    """The folded cores k, v (B, C', C) and their mask beta (B, 1, C') padded to a
    multiple of ``SOFTMAX_WIDTH`` keys on the CPU for C' > 1: zero keys and values under
    a -inf mask, whose weights are exactly 0 (torch's CPU flash attention is slower over
    a key count that is not a multiple of one vector; one key is faster unpadded)."""
    pad = -k.shape[1] % SOFTMAX_WIDTH
    if not cpu_layout(k) or k.shape[1] == 1 or not pad:
        return k, v, beta
    k, v = (F.pad(t, (0, 0, 0, pad)) for t in (k, v))  # (B, C' + pad, C)
    return k, v, F.pad(beta, (0, pad), value=float('-inf'))  # (B, 1, C' + pad)


class Scores(torch.autograd.Function):
    """``baddbmm(beta, x, k^T)``: scores (B, n, K) of x (B, n, C) against k (B, K, C) plus
    beta (B, 1, K), whose backward takes the gradient of k as ``ds^T x`` (B, K, C).
    Autograd's own ``(x^T ds)^T`` is a GEMM that MKL runs far slower for a few columns K
    over a long n (the folded broadcast of one head over a few cores C')."""

    @staticmethod
    def forward(ctx, beta, x, k):
        ctx.save_for_backward(x, k)
        return torch.baddbmm(beta, x, k.transpose(1, 2))  # (B, n, K)

    @staticmethod
    def backward(ctx, ds):
        x, k = ctx.saved_tensors  # as given: under autocast baddbmm cast them, not saved
        x, k = x.to(ds.dtype), k.to(ds.dtype)  # autograd casts each gradient back
        need = ctx.needs_input_grad
        return (
            ds.sum(1, keepdim=True) if need[0] else None,  # (B, 1, K)
            ds @ k if need[1] else None,  # (B, n, C)
            ds.transpose(1, 2) @ x if need[2] else None,  # (B, K, C)
        )
