"""The opt-in Triton kernel of circulant attention's core (METHOD.md, 'One kernel'): the
custom operator ``mmcirc::circulant_core`` (Eq. 15, the softmax, Eq. 16 and the gate's
SiLU product in one Triton program per (batch, head) map, :mod:`mmcirc.ops.circulant_triton`),
its fake (meta) implementation and its autograd, and when a layer takes it.

``CirculantAttention(kernel='triton')`` (or ``MMCIRC_KERNEL=triton``:
:mod:`mmcirc.ops.settings`) runs its core through the operator where it applies
(:func:`kernel_refusal`): CUDA tensors, or CPU ones in Triton's interpreter
(``TRITON_INTERPRET=1`` before the kernels are first used: how the suite tests it);
float32, bfloat16 or float16 tokens; a DFT grid of at most :data:`MAX_GRID` cells a side
(maps up to 64 x 64; ``'zero'``: 32 x 32); the torch.fft backend. Elsewhere the layer
takes its torch path, the reference, with one warning per layer shape and reason
(:func:`report_torch_path`). The operator refuses what it cannot compute in one line
naming the argument (:func:`check_core_args`).

This file depends on torch only; triton is imported on the operator's first call.
"""

import warnings
from typing import List, NamedTuple, Optional

import torch
from torch import Tensor

from .settings import PRECISIONS, check_choice, current, graph_capture

__all__ = [
    'MAX_GRID',
    'CoreArgs',
    'check_core_args',
    'circulant_core',
    'kernel_refusal',
    'layer_core',
    'pack_weights',
    'report_torch_path',
]

#: the largest DFT grid side the kernel takes (its tiles are powers of two up to this)
MAX_GRID = 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class CoreArgs(NamedTuple):
    """:func:`circulant_core`'s arguments after the tensors, where a layer's plan runs it."""

    h: int
    w: int
    heads: int
    zero: bool  #: the zero boundary
    scale: float  #: Eq. 15's s


def _dtype_name(dtype) -> str:
    return str(dtype).replace('torch.', '')


_DTYPE_NAMES = ', '.join(_dtype_name(d) for d in DTYPES)


def _grid_refusal(hw, zero: bool) -> Optional[str]:
    """Why the kernel cannot take an ``hw`` map's DFT grid (None: it can)."""
    grid = (2 * hw[0] - 1, 2 * hw[1] - 1) if zero else tuple(hw)
    if max(grid) <= MAX_GRID:
        return None
    maps = f'{MAX_GRID // 2}x{MAX_GRID // 2}' if zero else f'{MAX_GRID}x{MAX_GRID}'
    boundary = 'zero' if zero else 'circular'
    return (
        f'size: the {hw[0]}x{hw[1]} map makes a {grid[0]}x{grid[1]} DFT grid, above '
        f"{MAX_GRID} cells a side; boundary '{boundary}' takes maps up to {maps}"
    )


def _device_refusal(device) -> Optional[str]:
    if device.type == 'cuda':
        return None
    if device.type == 'cpu':
        try:  # imports the kernels: TRITON_INTERPRET is read when they are defined
            from . import circulant_triton
        except ImportError:
            return 'device: cpu tensors; triton is not installed'
        if circulant_triton.interpreted():
            return None
    return (
        f"device: {device.type} tensors; it takes cuda tensors, or cpu ones in Triton's "
        'interpreter (TRITON_INTERPRET=1 before its first use)'
    )


def kernel_refusal(x, hw, boundary) -> Optional[str]:
    """Why the kernel does not run the core of a layer on tokens ``x`` of an ``hw`` map
    (see the module docstring), in words starting with what: ``'size: ...'``,
    ``'dtype: ...'``, ``'device: ...'``, ``'backend: ...'``; None where it runs it.
    Decided once per input shape (the layer's plan)."""
    impl = current().fft_impl
    if impl != 'torch':
        return f'backend: the DFTs are {impl!r} (export), not torch.fft'
    if x.dtype not in DTYPES:
        return f'dtype: {_dtype_name(x.dtype)} tokens; it takes {_DTYPE_NAMES}'
    return _grid_refusal(hw, boundary != 'circular') or _device_refusal(x.device)


#: (layer shape, reason) pairs :func:`report_torch_path` has reported in this process
_REPORTED = set()


def report_torch_path(layer, hw, why: str) -> None:
    """Warn, once per layer shape (channels, heads, boundary, map) and reason, that
    ``layer`` asked for ``kernel='triton'`` runs its torch path on an ``hw`` map because
    of ``why`` (:func:`kernel_refusal`). Eager calls only: a graph being captured
    (torch.compile, export) cannot hold a warning."""
    if graph_capture():
        return
    key = (layer.dim, layer.num_heads, layer.boundary, tuple(int(n) for n in hw), why)
    if key in _REPORTED:
        return
    _REPORTED.add(key)
    warnings.warn(
        f"kernel='triton' does not apply to CirculantAttention(dim={layer.dim}, "
        f'num_heads={layer.num_heads}, boundary={layer.boundary!r}) on a {hw[0]}x{hw[1]} '
        f'map, which runs the torch.fft path: {why}',
        stacklevel=3,
    )


def check_core_args(q, k, v, gate, h, w, heads, zero, precision, device=True) -> None:
    """What :func:`circulant_core` computes, else a one-line ``TypeError`` / ``ValueError``
    naming the argument and what it takes: q, k, v (and the gate) of one dtype of
    :data:`DTYPES` and one shape (B, h w, C), C a multiple of ``heads``; a DFT grid of at
    most :data:`MAX_GRID` cells a side; ``precision`` of :data:`PRECISIONS`; with
    ``device``, a device it runs on (cuda; cpu in Triton's interpreter)."""
    tensors = dict(q=q, k=k, v=v) if gate is None else dict(q=q, k=k, v=v, gate=gate)
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise TypeError(
                f'circulant_core: {name} must be {_DTYPE_NAMES}, got {_dtype_name(t.dtype)}'
            )
        if (t.dtype, t.shape, t.device) != (q.dtype, q.shape, q.device):
            raise ValueError(
                f"circulant_core: {name} must have q's dtype, shape and device "
                f'({_dtype_name(q.dtype)} {tuple(q.shape)} {q.device}), got '
                f'{_dtype_name(t.dtype)} {tuple(t.shape)} {t.device}'
            )
    if q.dim() != 3 or h < 1 or w < 1 or q.shape[1] != h * w:
        raise ValueError(
            f'circulant_core: q must be (B, h*w, C) tokens of the h={h} x w={w} map, '
            f'got {tuple(q.shape)}'
        )
    if heads < 1 or q.shape[2] % heads:
        raise ValueError(f'circulant_core: heads must divide C={q.shape[2]}, got {heads}')
    check_choice('circulant_core: precision', precision, PRECISIONS)
    why = _grid_refusal((h, w), zero)
    if why is not None:
        raise ValueError(f'circulant_core: h, w: {why[len("size: ") :]}')
    if device and _device_refusal(q.device) is not None:
        raise ValueError(
            f'circulant_core: q is a {q.device.type} tensor: the kernel runs on cuda, or on '
            "cpu in Triton's interpreter (TRITON_INTERPRET=1 before its first use)"
        )


def _strided(q, k, v):
    """q, k, v with one set of strides (the kernel reads them with one), else contiguous."""
    if q.stride() == k.stride() == v.stride():
        return q, k, v
    return q.contiguous(), k.contiguous(), v.contiguous()


@torch.library.custom_op('mmcirc::circulant_core', mutates_args=())
def circulant_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gate: Optional[Tensor],
    h: int,
    w: int,
    heads: int,
    zero: bool,
    scale: float,
    precision: str = 'ieee',
) -> Tensor:
    """Circulant attention's core on tokens q, k, v (B, N, C) of an h x w map (row-major),
    heads of C / heads channels, ``zero``: the zero boundary, ``scale``: Eq. 15's s; times
    SiLU(gate) where a gate pre-activation (B, N, C) is given. Returns (B, N, C) in q's
    dtype, contiguous; computed in float32. What it cannot compute is refused
    (:func:`check_core_args`)."""
    check_core_args(q, k, v, gate, h, w, heads, zero, precision)
    from . import circulant_triton

    q, k, v = _strided(q, k, v)
    return circulant_triton.forward(q, k, v, gate, (h, w), heads, zero, scale, precision)


@circulant_core.register_fake
def _(q, k, v, gate, h, w, heads, zero, scale, precision='ieee'):
    check_core_args(q, k, v, gate, h, w, heads, zero, precision, device=False)
    return q.new_empty(q.shape)


@torch.library.custom_op('mmcirc::circulant_core_backward', mutates_args=())
def circulant_core_backward(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gate: Optional[Tensor],
    h: int,
    w: int,
    heads: int,
    zero: bool,
    scale: float,
    precision: str = 'ieee',
) -> List[Tensor]:
    """(dq, dk, dv, dgate) of :func:`circulant_core` (dgate empty without a gate), by
    recomputation from q, k, v: no tensor of the offsets is kept from the forward."""
    from . import circulant_triton

    q, k, v = _strided(q, k, v)
    grads = circulant_triton.backward(
        dy.contiguous(), q, k, v, gate, (h, w), heads, zero, scale, precision
    )
    return [g if g is not None else q.new_empty(0) for g in grads]


@circulant_core_backward.register_fake
def _(dy, q, k, v, gate, h, w, heads, zero, scale, precision='ieee'):
    return [q.new_empty(q.shape) for _ in range(3)] + [
        q.new_empty(q.shape if gate is not None else 0)
    ]


def _setup_context(ctx, inputs, output):
    q, k, v, gate, *ctx.args = inputs
    ctx.save_for_backward(q, k, v, gate)


def _backward(ctx, dy):
    q, k, v, gate = ctx.saved_tensors
    dq, dk, dv, dg = circulant_core_backward(dy, q, k, v, gate, *ctx.args)
    return dq, dk, dv, None if gate is None else dg, None, None, None, None, None, None


circulant_core.register_autograd(_backward, setup_context=_setup_context)


def pack_weights(layer):
    """The qkv and gate weights of ``layer`` as one linear (4C, C) and bias (4C,), made
    once and kept while the parameters are the same tensors at the same version (in
    inference: one matrix product instead of two; made when the layer is switched to eval
    mode, else on its first forward that needs it)."""
    wq, wg, bg = layer.qkv.weight, layer.gate[0].weight, layer.gate[0].bias
    key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in (wq, wg, bg))
    kept = layer.__dict__.get('_packed_qkvg')
    if kept is None or kept[0] != key:
        with torch.no_grad():
            bias = torch.cat([bg.new_zeros(wq.shape[0]), bg])
            kept = layer.__dict__['_packed_qkvg'] = (key, torch.cat([wq, wg]), bias)
    return kept[1:]


def layer_core(layer, x, core):
    """The core of a :class:`~mmcirc.ops.circulant.CirculantAttention` ``layer`` on tokens
    x (B, N, C) by :func:`circulant_core`: ``o * SiLU(x W_gate + b_gate)`` (B, N, C), o
    from q, k, v = x W_q, x W_k, x W_v; ``core`` the :class:`CoreArgs` of the layer's plan,
    the precision that of :mod:`mmcirc.ops.settings`. With gradients to the weights, and in
    a captured graph, the qkv and gate linears run apart; otherwise as one product
    (:func:`pack_weights`)."""
    c = layer.dim
    params = (layer.qkv.weight, layer.gate[0].weight, layer.gate[0].bias)
    if graph_capture() or (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
        qkv = torch.nn.functional.linear(x, params[0])  # (B, N, 3C)
        g = torch.nn.functional.linear(x, params[1], params[2])  # (B, N, C)
    else:
        qkv = torch.nn.functional.linear(x, *pack_weights(layer))  # (B, N, 4C): q, k, v, gate
        g = qkv[..., 3 * c :]
    q, k, v = qkv[..., :c], qkv[..., c : 2 * c], qkv[..., 2 * c : 3 * c]
    return circulant_core(q, k, v, g, *core, current().precision)
