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

Which modules are attention (``attention_flops``, :func:`attention_modules`) this
file does not know: it asks each module for its probe (:mod:`mmcirc.analysis.probes`,
which also says how an operator declares the handles of the aten ops it traces to);
:class:`FlopCounter` adds the handles of every probe and declaring operator in the model
(the built-in ones: :mod:`mmcirc.analysis.flop_handles`).

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
import warnings
from typing import List, Sequence

import torch
from torch import nn

from .flop_handles import FLOP_HANDLES, FREE_OPS

__all__ = [
    'FlopCounter',
    'declared_flop_handles',
    'register_flop_handles',
    'count_flops',
    'flop_counter',
    'get_complexity',
    'count_params',
    'attention_modules',
    'meta_compat',
]


def _probes():
    try:
        from .probes import attention_probes
    except ImportError:  # no mmcv / mmdet (torch-only machine): no registered blocks
        return []
    return attention_probes()


def _is_attention(module, probes) -> bool:
    if isinstance(getattr(type(module), 'attention_kind', None), str):
        return True  # the operator declares itself
    return any(p.matches(module) for p in probes)


def declared_flop_handles(model: nn.Module = None) -> dict:
    """The op handles the attention probes declare, and those of the operators in
    ``model`` that declare their attention themselves (later ones win)."""
    out = {}
    for probe in _probes():
        out.update(probe.flop_handles)
    if model is not None:
        for m in model.modules():
            if isinstance(getattr(type(m), 'attention_kind', None), str):
                out.update(getattr(type(m), 'flop_handles', None) or {})
    return out


@contextlib.contextmanager
def register_flop_handles():
    """Within the block, every new mmengine ``FlopAnalyzer`` (also the one in
    ``mmengine.analysis.get_model_complexity_info`` and tools built on it)
    uses :data:`FLOP_HANDLES` too."""
    from mmengine.analysis import complexity_analysis as ca

    saved = dict(ca._DEFAULT_SUPPORTED_FLOP_OPS)
    ca._DEFAULT_SUPPORTED_FLOP_OPS.update(FLOP_HANDLES, **declared_flop_handles())
    try:
        yield
    finally:
        ca._DEFAULT_SUPPORTED_FLOP_OPS.clear()
        ca._DEFAULT_SUPPORTED_FLOP_OPS.update(saved)


@functools.lru_cache(maxsize=None)
def _flop_analyzer_cls():
    from mmengine.analysis import FlopAnalyzer

    class FlopCounter(FlopAnalyzer):
        """mmengine ``FlopAnalyzer`` with :data:`FLOP_HANDLES` (:data:`FREE_OPS` ignored),
        then the handles :func:`declared_flop_handles` finds in ``model`` (see
        :mod:`mmcirc.analysis.flops` for the convention). Results: ``total(name)``,
        ``by_module()``, ``by_operator(name)``, ``by_module_and_operator()``; all in MACs."""

        def __init__(self, model, inputs):
            super().__init__(model, inputs)
            self.set_op_handle(**FLOP_HANDLES, **dict.fromkeys(FREE_OPS))
            self.set_op_handle(**declared_flop_handles(model))
            self.tracer_warnings('none')

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
        return False if args and str(args[0]) == 'meta' else is_enabled(*args, **kwargs)

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
def _forward_as(model: nn.Module, forward):
    """``model.forward`` replaced by ``forward`` within the block (None: kept)."""
    if forward is None:
        yield
        return
    saved = model.__dict__.get('forward')
    model.forward = forward
    try:
        yield
    finally:
        if saved is None:
            del model.forward
        else:
            model.forward = saved


def flop_counter(model: nn.Module, inputs, warn: bool = False, forward=None, **kwargs):
    """Run the analysis and return the :class:`FlopCounter` (results cached).

    Args:
        model: module to trace (put in eval mode for inference counts).
        inputs: a tensor or a tuple of tensors, the positional arguments.
            Model and inputs on the ``meta`` device: shapes only, no compute
            (see :func:`meta_compat`).
        warn: print mmengine's unsupported-op / uncalled-module warnings.
        forward: the function counted instead of ``model.forward`` (e.g.
            ``model.extract_feat``), with the module names of ``model``.
        **kwargs: further (non-tensor) forward arguments, e.g. ``hw_shape``
            (bound: jit traces tensors only).
    """
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    if kwargs:
        forward = functools.partial(forward or model.forward, **kwargs)
    fc = _flop_analyzer_cls()(model, inputs)
    fc.unsupported_ops_warnings(warn).uncalled_modules_warnings(warn)
    on_meta = any(isinstance(t, torch.Tensor) and t.is_meta for t in inputs)
    with _forward_as(model, forward), torch.no_grad(), warnings.catch_warnings(), (
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


def attention_modules(model: nn.Module) -> List[str]:
    """Names of the outermost attention submodules: those with a probe (the operator's
    own declaration, a registered block's probe, another library's layer), e.g.
    CirculantAttention, CoreAttention, mmdet's SpatialReductionAttention and
    WindowMSA, a ViT's self-attention, nn.MultiheadAttention."""
    probes = _probes()
    names = []
    for name, mod in model.named_modules():
        if name and not any(name.startswith(p + '.') for p in names) and _is_attention(mod, probes):
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
