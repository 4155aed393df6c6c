"""Which memory layout an operator's eager forward takes: the one tuned for CPU caches or
the one for a GPU.

On the CPU, mmcirc's operators block their work to fit the caches: circulant attention
splits its heads into blocks of about 8 MiB of spectra and transposes tokens one batch
element at a time, large inverse FFTs run map by map, and the MLPs of a block run over
chunks of tokens in inference. On a GPU each of these multiplies the kernels launched,
and an eager forward there is bound by the host's ~30 us per launched kernel: so a CUDA
tensor takes one batched transform over all heads, one transpose and one MLP call.

The rule is the tensor's device, unless the environment variable ``MMCIRC_LAYOUT`` is
``cpu`` or ``cuda`` (read when this module is imported): then every tensor takes that
layout, so that the path a CUDA tensor takes runs, is tested and is counted on the CPU
(``MMCIRC_LAYOUT=cuda``). :func:`forced_layout` sets the same override for a block of
code. Both layouts compute the same result up to float rounding.

This file depends on torch only.
"""

import contextlib
import os

__all__ = ['FORCED', 'LAYOUTS', 'LAYOUT_ENV', 'cpu_layout', 'forced_layout']

LAYOUTS = ('cpu', 'cuda')
LAYOUT_ENV = 'MMCIRC_LAYOUT'


def _check(value, name):
    if value is not None and value not in LAYOUTS:
        raise ValueError(f'{name} must be one of {LAYOUTS} (or unset), got {value!r}')
    return value


#: the layout every tensor takes (``'cpu'`` or ``'cuda'``), or None: the device's (read
#: only: ``MMCIRC_LAYOUT`` and :func:`forced_layout` set it)
FORCED = _check(os.environ.get(LAYOUT_ENV) or None, LAYOUT_ENV)


def cpu_layout(t) -> bool:
    """Whether tensor ``t``'s forward takes the CPU layout (cache-sized blocks, per-batch
    transposes, chunked MLPs): ``t`` is on the CPU and no override says otherwise."""
    return t.device.type == 'cpu' if FORCED is None else FORCED == 'cpu'


@contextlib.contextmanager
def forced_layout(layout):
    """Context: every tensor takes ``layout`` (``'cpu'``, ``'cuda'``, or None for the
    device's rule); the previous override is restored on exit. Sets a module global (not
    thread-safe), as ``MMCIRC_LAYOUT`` does for the whole process."""
    global FORCED
    prev, FORCED = FORCED, _check(layout, 'layout')
    try:
        yield
    finally:
        FORCED = prev
