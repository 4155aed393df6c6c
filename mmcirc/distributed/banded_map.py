"""A row-banded map: one rank's band of rows of a feature map that still reports the
global shape, so that a model's own forward (its shape arithmetic, mmseg's ``resize``
to ``x.shape[2:]``) runs on it unchanged.

:class:`BandedMap` is a thin ``torch.Tensor`` wrapper (no storage of its own) around
the local band ``local``; it knows the map's global ``shape``, which axis carries the
rows (``band_dim``), how many elements of that axis one row is (``unit``: 1 for the H
axis of (B, C, H, W), W for the N axis of tokens (B, N, C)), the global rows
``height``, the process ``group`` and the row bounds of every rank
(:func:`~mmcirc.distributed.row_split.band_bounds` of ``height``, computed once, never
gathered). A token map may carry a replicated ``prefix`` of k tokens ahead of the rows
on its row axis, held whole by every rank (VECA's cores before its patches: global
length k + H unit, local k + h_r unit): ``torch.cat([plain (B, k, D), tokens], 1)``
makes it, ``x[:, :k]`` is the plain prefix and ``x[:, k:]`` the map without it; only
the local set, slicing of other axes, ``torch.cat`` / ``chunk`` along other axes and
the operators registered with ``prefix=True`` take such a map (anything else: refused).

Why not DTensor (docs/sharded.md): its ``Shard(1)`` of a token map (B, N, C) splits N
off the row boundaries, and it refuses ``flatten`` of an unevenly sharded axis; the rows
themselves are split as its ``Shard`` splits them (:meth:`BandedMap.full_tensor` matches
``DTensor.full_tensor`` on a ``Shard`` placement of the H axis).

Every torch function that reaches a BandedMap goes through ``__torch_function__``:

* metadata (``shape``, ``dim()``, ``dtype``, ...) answers for the global map;
* a function in :data:`HANDLERS` (registered with :func:`register`: convolutions with
  halos, interpolation, pooling, GroupNorm, the token reshapes, concatenation, the
  attention operators) computes this rank's band of the single-process result;
* a function in the local set (channel-wise and elementwise ops, linear, LayerNorm
  over channels, activations, dropout) runs on the local band; a plain tensor operand
  that spans every global row is cut to the band first;
* anything else raises a one-line ValueError naming the function.

Autograd: the wrapper records nothing (``requires_grad`` False); ``local`` is an ordinary
tensor of the rank's graph and every handler is differentiable, so ``backward`` on a
rank's part of the loss gives its part of every gradient (see :mod:`.comm`).
"""

import weakref
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

from .comm import Layout, exchange_rows, group_rank_size
from .row_split import band_bounds

__all__ = [
    'BandedMap', 'HANDLERS', 'LOCAL_FUNCTIONS', 'OPERATORS', 'ShardedOperator', 'func_name',
    'functions_of', 'operator_twin', 'refuse', 'register', 'register_operator',
    'shard_operators', 'tensors_in',
]  # fmt: skip

#: torch function -> handler(*args, **kwargs) for ops that need neighbours or a global view.
HANDLERS: Dict[Callable, Callable] = {}
#: module class -> handler(module, *args, **kwargs): the attention operators, whose
#: forward is a Python method (no torch function to key by), registered by their
#: modules in :mod:`mmcirc.distributed.handlers`.
OPERATORS: Dict[type, Callable] = {}


#: The handlers (of HANDLERS and OPERATORS) that take a map with a replicated prefix.
_TAKE_PREFIX = set()


def register(*funcs: Callable, prefix: bool = False, table: Dict = HANDLERS):
    """Decorator: the handler of ``funcs`` in ``table`` (torch functions or Tensor
    methods; :func:`register_operator`: module classes); ``prefix``: it also computes
    maps with a replicated prefix exactly."""

    def wrap(handler):
        table.update(dict.fromkeys(funcs, handler))
        if prefix:
            _TAKE_PREFIX.add(handler)
        return handler

    return wrap


def register_operator(cls: type, prefix: bool = False):
    """Decorator: the handler of ``cls``'s forward on a BandedMap (see
    :func:`shard_operators`); ``prefix`` as for :func:`register`."""
    return register(cls, prefix=prefix, table=OPERATORS)


def _check_prefix(handler, func, values) -> None:
    """Refuse a map with a replicated prefix in a handler that does not take one."""
    if handler not in _TAKE_PREFIX and any(m.prefix for m in _bands_in(values)):
        raise refuse(func, 'has no handler for a map with a replicated prefix')


class _OperatorForward:
    """A module's forward that hands a BandedMap input to its operator handler."""

    def __init__(self, module, handler, forward):
        self.module, self.handler, self.forward = module, handler, forward

    def __call__(self, *args, **kwargs):
        values = list(args) + list(kwargs.values())
        if _bands_in(values):
            _check_prefix(self.handler, type(self.module), values)
            return self.handler(self.module, *args, **kwargs)
        return self.forward(*args, **kwargs)


def shard_operators(model) -> int:
    """Give every submodule of ``model`` that is an instance of a class in
    :data:`OPERATORS` a forward that runs the handler on BandedMap inputs (plain inputs:
    the module's own forward). In place, nothing copied; returns how many."""
    n = 0
    for m in model.modules():
        for cls in type(m).__mro__:
            if cls in OPERATORS and not isinstance(m.forward, _OperatorForward):
                m.forward = _OperatorForward(m, OPERATORS[cls], m.forward)
                n += 1
                break
    return n


_TWINS: 'weakref.WeakKeyDictionary' = weakref.WeakKeyDictionary()


class ShardedOperator:
    """Mixin of a sharded attention operator (``class Sharded(ShardedOperator, Layer)``):
    the single-process layer's arguments plus ``group`` (the spatial process group; None:
    the default group), and :meth:`from_module`."""

    #: the arguments of the layer that :meth:`from_module` reads back from its attributes
    ARGS: tuple = ()

    def __init__(self, *args, group=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = group

    @classmethod
    def from_module(cls, module, group=None):
        """A sharded layer sharing ``module``'s (a layer of the single-process class)
        weights and submodules (not copied), in its train / eval mode."""
        layer = cls.__mro__[2]  # the single-process class, after this mixin
        if not isinstance(module, layer):
            raise TypeError(f'module must be a {layer.__name__}, got {type(module).__name__}')
        new = cls(**{name: getattr(module, name) for name in cls.ARGS}, group=group)
        for name, child in module.named_children():  # shared, not copied
            setattr(new, name, child)
        return new.train(module.training)


def operator_twin(module, cls: type, group):
    """``cls.from_module(module, group)``, the sharded twin of an operator ``module``
    sharing its weights: made once per module and process group, then reused."""
    twin = _TWINS.get(module)
    if twin is None or twin.group is not group:
        twin = _TWINS[module] = cls.from_module(module, group)
    return twin


def func_name(func) -> str:
    """``torch.conv2d`` / ``Tensor.flatten`` / ``F.interpolate``: how errors name ``func``."""
    name = getattr(func, '__name__', repr(func))
    if getattr(func, '__objclass__', None) is not None:
        return f'Tensor.{name}'
    mod = getattr(func, '__module__', None) or 'torch'
    return f'{mod}.{name}'.replace('torch.nn.functional', 'F').replace('torch._C._nn', 'F')


def functions_of(module, *names):
    """The functions ``module.<name>`` of ``names`` that this torch has."""
    return [getattr(module, n) for n in names if hasattr(module, n)]


_ELEMENTWISE = set(
    functions_of(
        torch.Tensor, 'add', 'add_', 'sub', 'sub_', 'mul', 'mul_', 'div', 'div_', 'neg', 'exp',
        'sqrt', 'rsqrt', 'sigmoid', 'tanh', 'relu', 'relu_', 'clamp', 'clamp_', 'abs', 'pow',
        '__add__', '__radd__', '__iadd__', '__sub__', '__rsub__', '__isub__', '__mul__',
        '__rmul__', '__imul__', '__truediv__', '__rtruediv__', '__itruediv__', '__neg__',
        '__pow__', 'to', 'type_as', 'float', 'double', 'half', 'contiguous', 'clone',
        'detach', 'masked_fill', 'lerp', 'addcmul', 'sign',
    )
    + functions_of(
        torch, 'add', 'sub', 'mul', 'div', 'neg', 'exp', 'sqrt', 'rsqrt', 'sigmoid', 'tanh',
        'relu', 'relu_', 'clamp', 'abs', 'pow', 'where', 'clone', 'lerp', 'addcmul',
    )
    + functions_of(
        F, 'relu', 'relu_', 'relu6', 'hardtanh', 'gelu', 'silu', 'hardswish', 'hardsigmoid',
        'leaky_relu', 'elu', 'mish', 'sigmoid', 'tanh', 'dropout', 'dropout2d', 'dropout1d',
        'alpha_dropout',
    )
)  # fmt: skip
#: Ops that act along the last axes only (their tensor arguments are parameters) ->
#: (args, kwargs, ndim) -> the axes they act along.
_TRAILING = {
    F.linear: lambda a, k, nd: [nd - 1],
    F.layer_norm: lambda a, k, nd: range(nd - len(tuple(k.get('normalized_shape') or a[1])), nd),
    F.normalize: lambda a, k, nd: [k.get('dim', a[2] if len(a) > 2 else 1) % nd],
}
#: The local set: everything that runs on the band unchanged.
LOCAL_FUNCTIONS = frozenset(_ELEMENTWISE | set(_TRAILING))

_METADATA = frozenset(
    functions_of(
        torch.Tensor, 'size', 'dim', 'ndimension', 'numel', 'nelement', 'element_size',
        'is_floating_point', 'is_complex', 'get_device', 'is_contiguous', '__len__',
        'requires_grad_',
    )
)  # fmt: skip


def refuse(func, why: str = 'has no handler for a row-banded map') -> ValueError:
    """The one-line error of a handler: ``func`` (a function, or its name) ``why``."""
    name = func if isinstance(func, str) else func_name(func)
    return ValueError(f'sharded inference: {name} {why}')


class BandedMap(torch.Tensor):
    """This rank's band of rows of a global map. Build with :meth:`from_local` (the local
    band, the global height) or :meth:`scatter` (cut a whole map every rank holds);
    :meth:`full_tensor` assembles the whole map on every rank; ``local`` is the band."""

    @staticmethod
    def __new__(cls, local, shape, band_dim, unit, height, group, prefix=0):
        r = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=local.dtype, device=local.device, requires_grad=False
        )
        r.local = local
        r.band_dim, r.unit, r.height, r.group = band_dim, unit, height, group
        r.prefix = prefix
        r.rank, r.world_size = group_rank_size(group)
        r.bounds = band_bounds(height, r.world_size)
        a, b = r.bounds[r.rank]
        if local.shape[band_dim] != prefix + (b - a) * unit:
            raise ValueError(
                f'BandedMap: local has {local.shape[band_dim]} entries along dim {band_dim}, '
                f'rank {r.rank} of {r.world_size} owns rows [{a}, {b}) of {height}: '
                f'{prefix} + {(b - a) * unit} entries'
            )
        return r

    def __init__(self, *args, **kwargs):
        super().__init__()

    # ------------------------------------------------------------------ building
    @classmethod
    def from_local(cls, local, height: int, band_dim: int = -2, unit: int = 1, group=None,
                   prefix: int = 0):  # fmt: skip
        """The band ``local`` of a map ``height`` rows high along ``band_dim`` (after
        ``prefix`` replicated entries there)."""
        band_dim = band_dim % local.dim()
        shape = list(local.shape)
        shape[band_dim] = prefix + int(height) * unit
        return cls(local, torch.Size(shape), band_dim, unit, int(height), group, prefix)

    @classmethod
    def scatter(cls, full: torch.Tensor, band_dim: int = -2, group=None):
        """This rank's band of ``full`` (every rank holds it whole; no communication)."""
        band_dim = band_dim % full.dim()
        rank, size = group_rank_size(group)
        a, b = band_bounds(full.shape[band_dim], size)[rank]
        local = full.narrow(band_dim, a, b - a).contiguous()
        return cls.from_local(local, full.shape[band_dim], band_dim, 1, group)

    def like(self, local, height: Optional[int] = None):
        """A BandedMap of ``local`` in this map's band layout, group and prefix (``height``:
        a map of another height)."""
        h = self.height if height is None else height
        return BandedMap.from_local(local, h, self.band_dim, self.unit, self.group, self.prefix)

    @property
    def row_range(self):
        """(start, stop): this rank's global rows."""
        return self.bounds[self.rank]

    @property
    def layout(self) -> Layout:
        """The rows' :class:`~mmcirc.distributed.comm.Layout` (from the bounds, no collective)."""
        return Layout.of(self.height, len(self.bounds), self.rank)

    def same_layout(self, other: 'BandedMap') -> bool:
        return (self.band_dim, self.unit, self.height, self.group, self.prefix) == (
            other.band_dim, other.unit, other.height, other.group, other.prefix,
        )  # fmt: skip

    def cut(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's rows of ``t``, a plain tensor whose axis ``dim`` spans all rows
        (after the prefix, which is kept)."""
        (a, b), k = self.row_range, self.prefix
        band = t.narrow(dim, k + a * self.unit, (b - a) * self.unit)
        return torch.cat([t.narrow(dim, 0, k), band], dim) if k else band

    def full_tensor(self) -> torch.Tensor:
        """The whole map on every rank (an all-gather of the bands)."""
        if self.world_size == 1:
            return self.local
        bd, k = self.band_dim, self.prefix
        rows = self.local.narrow(bd, k, self.local.shape[bd] - k)  # (..., h_r unit, ...)
        rows = rows.unflatten(bd, (-1, self.unit))  # (..., h_r, unit, ...)
        wants = [(0, self.height)] * self.world_size
        whole = exchange_rows(rows, self.layout, wants, dim=bd, group=self.group)
        whole = whole.flatten(bd, bd + 1)  # (..., H unit, ...)
        return torch.cat([self.local.narrow(bd, 0, k), whole], bd) if k else whole

    def __repr__(self, *, tensor_contents=None):
        return (
            f'BandedMap(shape={tuple(self.shape)}, band_dim={self.band_dim}, rows '
            f'{self.row_range} of {self.height}, prefix={self.prefix}, '
            f'local={tuple(self.local.shape)})'
        )

    # ------------------------------------------------------------------ dispatch
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA or getattr(func, '__name__', '') == '__get__':
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        handler = HANDLERS.get(func)
        if handler is not None:
            _check_prefix(handler, func, list(args) + list(kwargs.values()))
            return handler(*args, **kwargs)
        if func in LOCAL_FUNCTIONS:
            return _run_local(func, args, kwargs)
        raise refuse(func)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise ValueError(
            f'sharded inference: {func} reached a row-banded map below torch functions'
        )


def tensors_in(values) -> list:
    """The tensors among ``values`` and in their (nested) lists and tuples."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += tensors_in(v)
    return out


def _bands_in(values) -> list:
    return [t for t in tensors_in(values) if isinstance(t, BandedMap)]


def _run_local(func, args, kwargs):
    """``func`` on the local bands; plain tensors spanning every row are cut to the band."""
    bands = _bands_in(list(args) + list(kwargs.values()))
    ref = bands[0]
    for m in bands[1:]:
        if not m.same_layout(ref):
            raise refuse(func, 'got row-banded maps of different layouts')
    trailing = func in _TRAILING
    if trailing and ref.band_dim in _TRAILING[func](args, kwargs, ref.dim()):
        raise refuse(func, 'over the banded axis has no handler')
    args = [_unwrap(a, ref, trailing, func) for a in args]
    kwargs = {k: _unwrap(v, ref, trailing, func) for k, v in kwargs.items()}
    return _wrap_like(ref, func(*args, **kwargs), func)


def _unwrap(v, ref: BandedMap, trailing: bool, func):
    """The local band of a BandedMap; a plain tensor spanning every row (broadcast from
    the right) cut to the band, unless ``func`` takes it as a parameter (``trailing``).
    (A module-level function: a recursive closure would keep ``ref`` in a reference
    cycle, holding every band until the garbage collector runs.)"""
    if isinstance(v, BandedMap):
        return v.local
    if isinstance(v, torch.Tensor) and not trailing:
        nd, bd = ref.dim(), ref.band_dim
        k = bd - (nd - v.dim())  # the banded axis of v, broadcast from the right
        if 0 <= k < v.dim() and v.shape[k] != 1:
            if v.shape[k] != ref.shape[bd]:
                raise refuse(func, f'got a plain operand of shape {tuple(v.shape)}')
            return ref.cut(v, k)
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(e, ref, trailing, func) for e in v)
    return v


def _wrap_like(ref: BandedMap, out, func):
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap_like(ref, o, func) for o in out)
    if not isinstance(out, torch.Tensor):
        return out
    a, b = ref.row_range
    if out.dim() != ref.dim() or out.shape[ref.band_dim] != ref.prefix + (b - a) * ref.unit:
        raise refuse(func, f'changed the banded axis (local output {tuple(out.shape)})')
    return ref.like(out)
