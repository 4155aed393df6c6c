"""The process-wide switches of mmcirc's operators, and what every operator reads with them.

Four switches choose how the operators compute; every choice computes the same equations
(the results agree up to float rounding):

* ``layout``: the memory layout of an eager forward (:func:`cpu_layout`; docs/method.md,
  'Layouts'): the CPU's, work blocked to fit the caches, or the GPU's, as few kernel
  launches as can be. The tensor's device decides, unless the layout is ``'cpu'`` or
  ``'cuda'`` (``MMCIRC_LAYOUT``, :func:`forced_layout`) for every tensor: so the path of a
  CUDA tensor runs, is tested and is counted on the CPU.
* ``fft_impl``: the 2-D DFTs of circulant attention, ``'torch'`` (torch.fft) or ``'dft'``
  (real matmuls, exportable: :func:`export_mode`; :mod:`mmcirc.ops.circulant_transforms`).
* ``kernel``: the core of a ``CirculantAttention`` built without ``kernel``: ``'torch'`` or
  ``'triton'`` (``MMCIRC_KERNEL``; :mod:`mmcirc.ops.circulant_kernel`).
* ``precision``: ``tl.dot``'s precision on float32 operands in that kernel, ``'ieee'`` or
  ``'tf32'`` (tensor cores, 10-bit mantissas; :func:`set_precision`).

:func:`current` gives them as one :class:`Settings`, the environment variables read and
checked on its first call (the first attention layer built, or the first forward of the
functional form), not on import: a bad value is a one-line ValueError naming the variable and the
allowed values. The setters change a module global (not thread-safe). A plan a layer
keeps per input shape is kept under the settings it was made with (:func:`cached_plan`).

This file depends on torch only.
"""

import contextlib
import os
from typing import NamedTuple, Optional

import torch

__all__ = [
    'FFT_IMPLS', 'KERNELS', 'KERNEL_ENV', 'LAYOUTS', 'LAYOUT_ENV', 'PLAN_CACHE_SIZE',
    'PRECISIONS', 'Settings', 'autocast_dtype', 'cached_plan', 'check_choice', 'cpu_layout',
    'current', 'default_kernel', 'export_mode', 'forced_layout', 'graph_capture',
    'set_precision', 'switched',
]  # fmt: skip

LAYOUTS = ('cpu', 'cuda')
FFT_IMPLS = ('torch', 'dft')
KERNELS = ('torch', 'triton')
PRECISIONS = ('ieee', 'tf32')
LAYOUT_ENV = 'MMCIRC_LAYOUT'
KERNEL_ENV = 'MMCIRC_KERNEL'
#: per-shape plans a layer keeps (emptied when full: detection and segmentation see a few
#: input sizes, not thousands)
PLAN_CACHE_SIZE = 32


class Settings(NamedTuple):
    """The switches (module docstring), one snapshot."""

    layout: Optional[str] = None  #: the layout every tensor takes; None: its device's
    fft_impl: str = 'torch'
    kernel: str = 'torch'  #: the kernel of a layer built without one
    precision: str = 'ieee'


_CHOICES = Settings(LAYOUTS, FFT_IMPLS, KERNELS, PRECISIONS)
_ENV = {'layout': LAYOUT_ENV, 'kernel': KERNEL_ENV}
_now: Optional[Settings] = None  # read from the environment by the first current()


def check_choice(name, value, allowed):
    """ValueError naming ``name`` and the ``allowed`` values unless ``value`` is one."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f'{name} must be one of {allowed}, got {value!r}')


def _checked(name, field, value):
    if value is not None or field != 'layout':  # layout None: the device's rule
        check_choice(name, value, getattr(_CHOICES, field))
    return value


def current() -> Settings:
    """The settings now; the environment's ``MMCIRC_LAYOUT`` and ``MMCIRC_KERNEL`` are read
    and checked on the first call (unset or empty: the defaults)."""
    global _now
    if _now is None:
        env = {f: os.environ.get(var) or None for f, var in _ENV.items()}
        env = {f: _checked(_ENV[f], f, v) for f, v in env.items() if v is not None}
        _now = Settings(**env)
    return _now


@contextlib.contextmanager
def switched(**values):
    """Context: the switches ``values`` (fields of :class:`Settings`, each checked: a
    ValueError names it) set; on exit each takes its previous value again."""
    global _now
    prev = current()
    _now = prev._replace(**{f: _checked(f, f, v) for f, v in values.items()})
    try:
        yield
    finally:
        _now = current()._replace(**{f: getattr(prev, f) for f in values})


def forced_layout(layout):
    """Context: every tensor takes ``layout`` (``'cpu'``, ``'cuda'``, or None for the
    device's rule), as ``MMCIRC_LAYOUT`` does for the whole process."""
    return switched(layout=layout)


def export_mode(enabled=True):
    """Context: circulant attention runs its 2-D DFTs as real matmuls built from the runtime
    H and W (``fft_impl='dft'``; ``enabled=False``: torch.fft): what ``torch.onnx.export``
    and other tracers without complex tensors take."""
    return switched(fft_impl='dft' if enabled else 'torch')


def set_precision(precision):
    """The ``tl.dot`` precision of the layers' kernel calls from now on: ``'ieee'`` (the
    default) or ``'tf32'``."""
    global _now
    _now = current()._replace(precision=_checked('precision', 'precision', precision))


def default_kernel(kernel=None):
    """``kernel`` checked (ValueError naming it and :data:`KERNELS`), or the settings'
    (``MMCIRC_KERNEL``, else ``'torch'``) for None; the settings read either way (a layer
    built reads them: a bad environment is said before a graph is captured)."""
    now = current()
    return now.kernel if kernel is None else _checked('kernel', 'kernel', kernel)


def cpu_layout(t) -> bool:
    """Whether tensor ``t``'s forward takes the CPU layout (cache-sized blocks, per-batch
    transposes, chunked MLPs): ``t`` is on the CPU and no forced layout says otherwise."""
    layout = current().layout
    return t.device.type == 'cpu' if layout is None else layout == 'cpu'


def graph_capture():
    """Whether torch.jit traces, dynamo compiles or torch.export exports this call: the one
    check for code that runs a faster eager form of an op only outside a captured graph
    (the FLOP count, torch.compile and ONNX keep the plain ops)."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()


def autocast_dtype(device_type):
    """The autocast dtype active for ``device_type``, or None (also for a device
    without autocast, e.g. ``meta``)."""
    if device_type == 'meta' or not torch.is_autocast_enabled(device_type):
        return None  # meta: shapes only, torch has no autocast state for it
    return torch.get_autocast_dtype(device_type)


def cached_plan(plans: dict, key: tuple, make):
    """The plan a layer keeps in ``plans`` under ``key`` and the settings now
    (:func:`current`: a plan made under other switches is not reused), else ``make()``,
    kept; ``plans`` is emptied when it holds :data:`PLAN_CACHE_SIZE` plans."""
    key = (_now or current(), *key)  # the snapshot; read once, by the first call
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= PLAN_CACHE_SIZE:
            plans.clear()
        plan = plans[key] = make()
    return plan
