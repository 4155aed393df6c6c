"""The mmengine op handles of mmcirc's FLOP convention (see :mod:`mmcirc.analysis.flops`
for the convention): FFTs, complex products, softmax / exp, SDPA, the fused
``nn.MultiheadAttention`` op and a broadcasting ``matmul``, and the ops counted free.
This file needs torch only (the handles read mmengine's traced ``torch._C.Value``s)."""

import contextlib
import math
from collections import Counter
from typing import Any, Dict, List, Optional

import torch

__all__ = ['FLOP_HANDLES', 'FREE_OPS', 'fft_macs']

#: MACs per n*log2(n) of a complex FFT of n points (5 n log2 n flops / 2).
FFT_COMPLEX_MACS = 2.5
#: MACs per n*log2(n) of a real-input FFT (or inverse to real) of n points.
FFT_REAL_MACS = 1.25
#: MACs per output element of complex x complex and complex x real products.
COMPLEX_MUL_MACS = 4
REAL_COMPLEX_MUL_MACS = 2
#: MACs per element of softmax / log_softmax / exp.
SOFTMAX_MACS = 1


def fft_macs(n: int, real: bool = False, batch: int = 1) -> float:
    """Analytic MACs of ``batch`` FFTs of ``n`` points (module convention)."""
    if n <= 1:
        return 0.0
    return batch * (FFT_REAL_MACS if real else FFT_COMPLEX_MACS) * n * math.log2(n)


# --------------------------------------------------------------- jit helpers
def _shape(val) -> Optional[List[int]]:
    with contextlib.suppress(RuntimeError):
        if val.isCompleteTensor():
            return list(val.type().sizes())
    return None


def _is_complex(val) -> bool:
    with contextlib.suppress(RuntimeError):
        if val.isCompleteTensor():
            return str(val.type().scalarType()).startswith('Complex')
    return False


def _const(val) -> Any:
    """Python value of a traced constant (also lists of constants), else
    ``_UNKNOWN``."""
    node = val.node()
    if node.kind() == 'prim::Constant':
        return val.toIValue()
    if node.kind() == 'prim::ListConstruct':
        items = [_const(v) for v in node.inputs()]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
    return _UNKNOWN


_UNKNOWN = object()

# aten FFT ops: name -> (kind, arity) with kind 'c2c' | 'r2c' | 'c2r' and
# arity 1 (n, dim), 2 (s, dim default (-2, -1)), 'n' (s, dim default all) or
# 'prim' (the primitives _fft_*(self, dim, ...)).
_FFT_OPS = {
    **{
        f'fft_{name}{suffix}': (kind, arity)
        for name, kind in dict(
            fft='c2c', ifft='c2c', rfft='r2c', irfft='c2r', ihfft='r2c', hfft='c2r'
        ).items()
        for suffix, arity in (('', 1), ('2', 2), ('n', 'n'))
    },
    **{f'_fft_{kind}': (kind, 'prim') for kind in ('c2c', 'r2c', 'c2r')},
}


def _fft_dims_and_last(arity, inputs, ndim):
    """(transformed dims, requested size of the last one or None)."""
    if arity == 'prim':
        dims = _const(inputs[1])
        return [d % ndim for d in dims], None
    size = _const(inputs[1])  # n (1-D) or s (2-D / n-D), None if absent
    dims = _const(inputs[2])
    if arity == 1:
        dims = [-1 if dims in (None, _UNKNOWN) else dims]
        last = None if size is _UNKNOWN else size
    else:
        if dims is _UNKNOWN:
            raise ValueError('FFT dims must be constant in the trace')
        if dims is None and arity == 2:
            dims = [-2, -1]
        elif dims is None:  # fftn without dim: the last len(s) dims, or all
            k = ndim if size in (None, _UNKNOWN) else len(size)
            dims = list(range(ndim - k, ndim))
        last = None if size in (None, _UNKNOWN) else size[-1]
    return [d % ndim for d in dims], last


def _fft_handle(kind: str, arity):

    def handle(inputs: List[Any], outputs: List[Any]) -> Counter:
        out = _shape(outputs[0])
        inp = _shape(inputs[0])
        dims, last = _fft_dims_and_last(arity, inputs, len(out))
        sizes = [out[d] for d in dims]
        if kind == 'r2c':  # output last dim is n//2+1: take n from n/s/input
            sizes[-1] = last if last is not None else inp[dims[-1]]
        batch = math.prod(out) // max(1, math.prod(out[d] for d in dims))
        macs = fft_macs(math.prod(sizes), real=kind != 'c2c', batch=batch)
        return Counter({'fft': macs})

    return handle


def _complex_mul_handle(inputs: List[Any], outputs: List[Any]) -> Counter:
    n_complex = sum(_is_complex(v) for v in inputs[:2])
    if not n_complex:
        return Counter()  # real elementwise: not counted (mmengine convention)
    per = COMPLEX_MUL_MACS if n_complex == 2 else REAL_COMPLEX_MUL_MACS
    return Counter({'complex_mul': per * math.prod(_shape(outputs[0]))})


def _elementwise_handle(name: str, per: float):

    def handle(inputs: List[Any], outputs: List[Any]) -> Counter:
        return Counter({name: per * math.prod(_shape(inputs[0]))})

    return handle


def _sdpa_handle(inputs: List[Any], outputs: List[Any]) -> Counter:
    q, k, v = (_shape(t) for t in inputs[:3])
    batch = math.prod(q[:-2])  # q carries all batch / head dims (also with GQA)
    lq, e = q[-2:]
    lk, ev = k[-2], v[-1]
    return Counter({'sdpa': batch * lq * lk * (e + ev), 'softmax': SOFTMAX_MACS * batch * lq * lk})


def _native_mha_handle(inputs: List[Any], outputs: List[Any]) -> Counter:
    """nn.MultiheadAttention's inference fast path (batch-first (B, L, E)):
    q/k/v and output projections as ``linear``, attention as ``sdpa``."""
    q, k = _shape(inputs[0]), _shape(inputs[1])
    heads = _const(inputs[4])
    b, lq, e = q
    lk = k[-2]
    return Counter(
        linear=b * (2 * lq + 2 * lk) * e * e,
        sdpa=2 * b * lq * lk * e,
        softmax=SOFTMAX_MACS * b * heads * lq * lk,
    )


def _matmul_handle(inputs: List[Any], outputs: List[Any]) -> Counter:
    """torch.matmul with 1-D operands and broadcast batch dims."""
    a, b = (_shape(t) for t in inputs[:2])
    if len(a) == 1 and len(b) == 1:
        return Counter({'matmul': a[0]})
    a = [1] + a if len(a) == 1 else a
    b = b + [1] if len(b) == 1 else b
    assert a[-1] == b[-2], (a, b)
    batch = math.prod(torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))
    return Counter({'matmul': batch * a[-2] * a[-1] * b[-1]})


def _baddbmm_handle(name: str):

    def handle(inputs: List[Any], outputs: List[Any]) -> Counter:
        b1, b2 = _shape(inputs[1]), _shape(inputs[2])
        return Counter({name: math.prod(b1) * b2[-1]})

    return handle


#: aten op -> handle, added to mmengine's defaults (``matmul`` replaced).
FLOP_HANDLES: Dict[str, Any] = {
    **{f'aten::{op}': _fft_handle(*spec) for op, spec in _FFT_OPS.items()},
    'aten::mul': _complex_mul_handle,
    'aten::mul_': _complex_mul_handle,
    **{
        f'aten::{op}': _elementwise_handle('softmax', SOFTMAX_MACS)
        for op in ('softmax', '_softmax', 'log_softmax', '_log_softmax', 'special_softmax')
    },
    **{f'aten::{op}': _elementwise_handle('exp', SOFTMAX_MACS) for op in ('exp', 'exp_')},
    'aten::scaled_dot_product_attention': _sdpa_handle,
    'aten::_native_multi_head_attention': _native_mha_handle,
    'aten::matmul': _matmul_handle,
    'aten::baddbmm': _baddbmm_handle('baddbmm'),
    'aten::addbmm': _baddbmm_handle('baddbmm'),
}

#: elementwise / bookkeeping ops our models trace that are deliberately free
#: (registered as ignored so that "unsupported operator" warnings stay useful).
FREE_OPS = tuple(
    f'aten::{op}'
    for op in """
_conj conj resolve_conj view_as_real view_as_complex
add add_ sub sub_ rsub div div_ neg mul_scalar floor_divide_ sqrt rsqrt pow abs sign square
reciprocal log erf tanh sigmoid silu silu_ gelu gelu_ softplus
sum mean amax maximum cumsum argmax ne lt le logical_or logical_and bitwise_or __or__
__iand__ __ior__ flip pad expand_as clone masked_fill_ new_ones repeat numel unflatten
lift_fresh alias view_as rand randn bernoulli_ feature_dropout fill_ zero_ meshgrid
linspace embedding im2col col2im unfold tril triu index_select where
""".split()
)
