"""FLOP counting for circulant / core attention on top of mmengine's counter.

mmengine's :class:`~mmengine.analysis.FlopAnalyzer` traces the model with
``torch.jit`` and prices each traced ``aten::`` op with a "handle". It has no
handle for FFTs, complex products, softmax or ``scaled_dot_product_attention``,
so circulant attention looks almost free, and its ``aten::matmul`` handle drops
the batch of a broadcast product whose first operand is a plain matrix (the
spectral qkv projection ``W @ FFT(x)``). This module adds those handles.

Counting convention (stated once; the tests check it against these formulas):

* Unit: multiply-accumulates (MACs), "FLOPs" in the sense of mmengine and the
  papers: one multiply-add counts 1, so a real (n x k) @ (k x m) product is
  n*k*m. mmengine's own handles (linear, conv, matmul, bmm, norms...) are kept.
* FFT: a complex FFT of n points costs the textbook 5 n log2 n real flops,
  i.e. ``2.5 * n * log2(n)`` MACs (1 MAC = 2 flops). A real-input FFT
  (``rfft*``) or its inverse to a real signal (``irfft*``) costs half of
  that, ``1.25 * n * log2(n)``. n is the number of points of one transform
  (the product of the transformed sizes, e.g. H*W for ``rfft2`` of an H x W
  map, after any ``n=``/``s=`` padding), and the cost is multiplied by the
  number of independent transforms (the other axes). ``log2`` is the real
  base-2 logarithm also when n is not a power of two (e.g. n = 14*14 counts
  ``2.5 * 196 * 7.615``); real FFT libraries are slower on sizes with large
  prime factors, which this count does not model (the timing benchmark does).
  Forward and inverse cost the same; normalisation is free.
* Complex elementwise product: complex x complex = 4 real multiplies
  (+2 adds absorbed) = 4 MACs per output element; complex x real = 2 MACs.
  ``conj`` is free (a lazy bit). Real elementwise ops (add, mul, SiLU, GELU,
  division...) are not counted, as in mmengine.
* Softmax / log-softmax: 1 MAC per element (its exponential; max, sum and
  division are elementwise and not counted). ``exp`` (an online softmax
  written by hand) likewise counts 1 per element.
* ``scaled_dot_product_attention`` with q (..., Lq, E), k (..., Lk, E),
  v (..., Lk, Ev): ``B*Lq*Lk*E`` (q k^T) + ``B*Lq*Lk*Ev`` (p v) MACs, reported
  as ``sdpa``, plus ``B*Lq*Lk`` for its softmax, reported as ``softmax``
  (B = the batch and head dims). Masks and ``is_causal`` do not reduce it.
* ``nn.MultiheadAttention``'s fused inference op
  (``_native_multi_head_attention``): its four projections as ``linear``
  (``B*(2*Lq + 2*Lk)*E*E``), ``2*B*Lq*Lk*E`` as ``sdpa`` and ``B*heads*Lq*Lk``
  as ``softmax``, the same as its unfused path.
* ``matmul`` with broadcasting: ``prod(broadcast batch) * n * k * m``;
  ``baddbmm`` / ``addbmm``: ``b * n * k * m`` (the added term is free).

Operator names in ``by_operator()``: ``fft``, ``complex_mul``, ``softmax``,
``exp``, ``sdpa``, ``baddbmm`` next to mmengine's ``linear``, ``matmul``,
``conv``, ``bmm``, ``layer_norm``...

Usage::

    from mmcirc.analysis import FlopCounter, count_flops, get_complexity
    fc = FlopCounter(model, (img, ))         # a FlopAnalyzer with our handles
    fc.total(), fc.by_module(), fc.by_operator()
    count_flops(attn, x, hw_shape=(56, 56))  # extra non-tensor args bound
    get_complexity(model, (3, 224, 224))     # dict: flops, params, breakdowns
    with register_flop_handles():            # mmengine's own helpers too
        mmengine.analysis.get_model_complexity_info(model, (3, 224, 224))
"""

import contextlib
import functools
import math
import warnings
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

__all__ = [
    'FFT_COMPLEX_MACS',
    'FFT_REAL_MACS',
    'COMPLEX_MUL_MACS',
    'REAL_COMPLEX_MUL_MACS',
    'SOFTMAX_MACS',
    'fft_macs',
    'FLOP_HANDLES',
    'FREE_OPS',
    'FlopCounter',
    'add_flop_handles',
    'register_flop_handles',
    'count_flops',
    'flop_counter',
    'get_complexity',
    'count_params',
    'attention_modules',
    'meta_compat',
]

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
    try:
        if val.isCompleteTensor():
            return list(val.type().sizes())
    except RuntimeError:
        pass
    return None


def _is_complex(val) -> bool:
    try:
        if val.isCompleteTensor():
            return str(val.type().scalarType()).startswith('Complex')
    except RuntimeError:
        pass
    return False


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


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
    'fft_fft': ('c2c', 1),
    'fft_ifft': ('c2c', 1),
    'fft_rfft': ('r2c', 1),
    'fft_irfft': ('c2r', 1),
    'fft_ihfft': ('r2c', 1),
    'fft_hfft': ('c2r', 1),
    'fft_fft2': ('c2c', 2),
    'fft_ifft2': ('c2c', 2),
    'fft_rfft2': ('r2c', 2),
    'fft_irfft2': ('c2r', 2),
    'fft_ihfft2': ('r2c', 2),
    'fft_hfft2': ('c2r', 2),
    'fft_fftn': ('c2c', 'n'),
    'fft_ifftn': ('c2c', 'n'),
    'fft_rfftn': ('r2c', 'n'),
    'fft_irfftn': ('c2r', 'n'),
    'fft_ihfftn': ('r2c', 'n'),
    'fft_hfftn': ('c2r', 'n'),
    '_fft_c2c': ('c2c', 'prim'),
    '_fft_r2c': ('r2c', 'prim'),
    '_fft_c2r': ('c2r', 'prim'),
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
        batch = _prod(out) // max(1, _prod(out[d] for d in dims))
        macs = fft_macs(_prod(sizes), real=kind != 'c2c', batch=batch)
        return Counter({'fft': macs})

    return handle


def _complex_mul_handle(inputs: List[Any], outputs: List[Any]) -> Counter:
    n_complex = sum(_is_complex(v) for v in inputs[:2])
    if not n_complex:
        return Counter()  # real elementwise: not counted (mmengine convention)
    per = COMPLEX_MUL_MACS if n_complex == 2 else REAL_COMPLEX_MUL_MACS
    return Counter({'complex_mul': per * _prod(_shape(outputs[0]))})


def _elementwise_handle(name: str, per: float):

    def handle(inputs: List[Any], outputs: List[Any]) -> Counter:
        return Counter({name: per * _prod(_shape(inputs[0]))})

    return handle


def _sdpa_handle(inputs: List[Any], outputs: List[Any]) -> Counter:
    q, k, v = (_shape(t) for t in inputs[:3])
    batch = _prod(q[:-2])  # q carries all batch / head dims (also with GQA)
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
        {
            'linear': b * (2 * lq + 2 * lk) * e * e,
            'sdpa': 2 * b * lq * lk * e,
            'softmax': SOFTMAX_MACS * b * heads * lq * lk,
        }
    )


def _matmul_handle(inputs: List[Any], outputs: List[Any]) -> Counter:
    """torch.matmul with 1-D operands and broadcast batch dims."""
    a, b = (_shape(t) for t in inputs[:2])
    if len(a) == 1 and len(b) == 1:
        return Counter({'matmul': a[0]})
    a = [1] + a if len(a) == 1 else a
    b = b + [1] if len(b) == 1 else b
    assert a[-1] == b[-2], (a, b)
    batch = _prod(torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))
    return Counter({'matmul': batch * a[-2] * a[-1] * b[-1]})


def _baddbmm_handle(name: str):

    def handle(inputs: List[Any], outputs: List[Any]) -> Counter:
        b1, b2 = _shape(inputs[1]), _shape(inputs[2])
        return Counter({name: _prod(b1) * b2[-1]})

    return handle


#: aten op -> handle, added to mmengine's defaults (``matmul`` replaced).
FLOP_HANDLES: Dict[str, Any] = {
    **{f'aten::{op}': _fft_handle(*spec) for op, spec in _FFT_OPS.items()},
    'aten::mul': _complex_mul_handle,
    'aten::mul_': _complex_mul_handle,
    'aten::softmax': _elementwise_handle('softmax', SOFTMAX_MACS),
    'aten::_softmax': _elementwise_handle('softmax', SOFTMAX_MACS),
    'aten::log_softmax': _elementwise_handle('softmax', SOFTMAX_MACS),
    'aten::_log_softmax': _elementwise_handle('softmax', SOFTMAX_MACS),
    'aten::special_softmax': _elementwise_handle('softmax', SOFTMAX_MACS),
    'aten::exp': _elementwise_handle('exp', SOFTMAX_MACS),
    'aten::exp_': _elementwise_handle('exp', SOFTMAX_MACS),
    'aten::scaled_dot_product_attention': _sdpa_handle,
    'aten::_native_multi_head_attention': _native_mha_handle,
    'aten::matmul': _matmul_handle,
    'aten::baddbmm': _baddbmm_handle('baddbmm'),
    'aten::addbmm': _baddbmm_handle('baddbmm'),
}

#: elementwise / bookkeeping ops our models trace that are deliberately free
#: (registered as ignored so that "unsupported operator" warnings stay useful).
FREE_OPS = (
    'aten::_conj',
    'aten::conj',
    'aten::resolve_conj',
    'aten::view_as_real',
    'aten::view_as_complex',
    'aten::add',
    'aten::add_',
    'aten::sub',
    'aten::sub_',
    'aten::rsub',
    'aten::div',
    'aten::div_',
    'aten::neg',
    'aten::silu',
    'aten::silu_',
    'aten::gelu',
    'aten::gelu_',
    'aten::sigmoid',
    'aten::sum',
    'aten::mean',
    'aten::amax',
    'aten::maximum',
    'aten::cumsum',
    'aten::flip',
    'aten::pad',
    'aten::expand_as',
    'aten::clone',
    'aten::masked_fill_',
    'aten::new_ones',
    'aten::repeat',
    'aten::sqrt',
    'aten::rsqrt',
    'aten::pow',
    'aten::abs',
    'aten::sign',
    'aten::tanh',
    'aten::ne',
    'aten::lt',
    'aten::le',
    'aten::logical_or',
    'aten::logical_and',
    'aten::bitwise_or',
    'aten::__or__',
    'aten::__iand__',
    'aten::__ior__',
    'aten::mul_scalar',
    'aten::numel',
    'aten::unflatten',
    'aten::lift_fresh',
    'aten::alias',
    'aten::rand',
    'aten::randn',
    'aten::bernoulli_',
    'aten::floor_divide_',
    'aten::meshgrid',
    'aten::linspace',
    'aten::embedding',
    'aten::view_as',
    'aten::feature_dropout',
    'aten::fill_',
    'aten::zero_',
    'aten::im2col',
    'aten::col2im',
    'aten::unfold',
    'aten::tril',
    'aten::triu',
    'aten::index_select',
    'aten::where',
    'aten::softplus',
    'aten::erf',
    'aten::log',
    'aten::reciprocal',
    'aten::square',
    'aten::argmax',
)


def add_flop_handles(analyzer):
    """Register :data:`FLOP_HANDLES` (and :data:`FREE_OPS` as ignored) on an
    mmengine ``JitModelAnalysis`` (e.g. ``FlopAnalyzer``); returns it."""
    analyzer.set_op_handle(**FLOP_HANDLES)
    analyzer.set_op_handle(**{op: None for op in FREE_OPS})
    return analyzer


@contextlib.contextmanager
def register_flop_handles():
    """Within the block, every new mmengine ``FlopAnalyzer`` (also the one in
    ``mmengine.analysis.get_model_complexity_info`` and tools built on it)
    uses :data:`FLOP_HANDLES` too."""
    from mmengine.analysis import complexity_analysis as ca

    saved = dict(ca._DEFAULT_SUPPORTED_FLOP_OPS)
    ca._DEFAULT_SUPPORTED_FLOP_OPS.update(FLOP_HANDLES)
    try:
        yield
    finally:
        ca._DEFAULT_SUPPORTED_FLOP_OPS.clear()
        ca._DEFAULT_SUPPORTED_FLOP_OPS.update(saved)


_COUNTER_CLS = []


def _flop_analyzer_cls():
    if _COUNTER_CLS:
        return _COUNTER_CLS[0]
    from mmengine.analysis import FlopAnalyzer

    class FlopCounter(FlopAnalyzer):
        """mmengine ``FlopAnalyzer`` with the handles of
        :mod:`mmcirc.analysis.flops` (see its docstring for the convention).
        Results: ``total(name)``, ``by_module()``, ``by_operator(name)``,
        ``by_module_and_operator()``; all in MACs."""

        def __init__(self, model, inputs):
            super().__init__(model, inputs)
            add_flop_handles(self)
            self.tracer_warnings('none')

    _COUNTER_CLS.append(FlopCounter)
    return FlopCounter


def __getattr__(name):  # FlopCounter is created lazily (mmengine import)
    if name == 'FlopCounter':
        return _flop_analyzer_cls()
    raise AttributeError(name)


@contextlib.contextmanager
def meta_compat():
    """Let code that queries autocast (the circulant FFT fp32 region) run on
    the ``meta`` device: inside the block ``torch.is_autocast_enabled('meta')``
    is False and ``torch.autocast('meta', ...)`` is a no-op. Counting on meta
    tensors traces shapes only, so a 2048 px backbone costs no compute."""
    is_enabled, autocast = torch.is_autocast_enabled, torch.autocast

    def meta_is_enabled(*args, **kwargs):
        if args and str(args[0]) == 'meta':
            return False
        return is_enabled(*args, **kwargs)

    def meta_autocast(device_type, *args, **kwargs):
        if str(device_type) == 'meta':
            return contextlib.nullcontext()
        return autocast(device_type, *args, **kwargs)

    torch.is_autocast_enabled, torch.autocast = meta_is_enabled, meta_autocast
    try:
        yield
    finally:
        torch.is_autocast_enabled, torch.autocast = is_enabled, autocast


@contextlib.contextmanager
def _bound_forward(model: nn.Module, kwargs: dict):
    """Bind non-tensor forward arguments (jit traces tensors only)."""
    if not kwargs:
        yield
        return
    had = 'forward' in model.__dict__
    saved = model.__dict__.get('forward')
    model.forward = functools.partial(model.forward, **kwargs)
    try:
        yield
    finally:
        if had:
            model.forward = saved
        else:
            del model.forward


def flop_counter(model: nn.Module, inputs, warn: bool = False, **kwargs):
    """Run the analysis and return the :class:`FlopCounter` (results cached).

    Args:
        model: module to trace (put in eval mode for inference counts).
        inputs: a tensor or a tuple of tensors, the positional arguments.
            Model and inputs on the ``meta`` device: shapes only, no compute
            (see :func:`meta_compat`).
        warn: print mmengine's unsupported-op / uncalled-module warnings.
        **kwargs: further (non-tensor) forward arguments, e.g. ``hw_shape``.
    """
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    fc = _flop_analyzer_cls()(model, inputs)
    fc.unsupported_ops_warnings(warn).uncalled_modules_warnings(warn)
    on_meta = any(isinstance(t, torch.Tensor) and t.is_meta for t in inputs)
    with _bound_forward(model, kwargs), torch.no_grad(), warnings.catch_warnings(), (
        meta_compat() if on_meta else contextlib.nullcontext()
    ):
        warnings.simplefilter('ignore')
        fc.total()  # trace now, while the bound forward is in place
    return fc


def count_flops(model: nn.Module, inputs, **kwargs) -> float:
    """Total MACs of ``model(*inputs, **kwargs)`` (module convention)."""
    return flop_counter(model, inputs, **kwargs).total()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


_ATTN_SUFFIXES = ('Attention', 'MSA', 'SRA', 'MultiheadAttention')


def attention_modules(model: nn.Module) -> List[str]:
    """Names of the outermost attention submodules (class name ending in
    Attention / MSA / SRA: CirculantAttention, CoreAttention, mmdet's
    SpatialReductionAttention and ShiftWindowMSA, nn.MultiheadAttention...)."""
    names = []
    for name, mod in model.named_modules():
        if name and type(mod).__name__.endswith(_ATTN_SUFFIXES):
            if not any(name.startswith(p + '.') for p in names):
                names.append(name)
    return names


def get_complexity(
    model: nn.Module, input_shape: Sequence[int] = None, inputs=None, **kwargs
) -> dict:
    """FLOPs (MACs) and parameters of ``model`` on one input.

    Args:
        input_shape: (C, H, W) -> a (1, C, H, W) random input; or give
            ``inputs`` (a tensor or tuple of tensors) instead.
        **kwargs: non-tensor forward arguments.

    Returns:
        dict with ``flops`` (MACs), ``params``, ``by_operator`` (Counter),
        ``by_module`` (Counter), ``attention_flops`` (MACs inside
        :func:`attention_modules`) and ``analyzer`` (the FlopCounter).
    """
    if (input_shape is None) == (inputs is None):
        raise ValueError('give exactly one of input_shape and inputs')
    if inputs is None:
        p = next(iter(model.parameters()), None)
        inputs = torch.randn(1, *input_shape, device=p.device if p is not None else 'cpu')
    fc = flop_counter(model, inputs, **kwargs)
    by_module = fc.by_module()
    attn = sum(by_module.get(n, 0) for n in attention_modules(model))
    return dict(
        flops=fc.total(),
        params=count_params(model),
        by_operator=fc.by_operator(),
        by_module=by_module,
        attention_flops=attn,
        analyzer=fc,
    )
