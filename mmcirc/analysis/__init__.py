"""Measurement helpers: FLOP counting with FFT / softmax / SDPA handles for
mmengine's counter (see :mod:`mmcirc.analysis.flops` for the convention)."""

from . import flops
from .flops import __all__  # noqa: F401


def __getattr__(name):
    """The public names of :mod:`.flops` (``FlopCounter`` is built lazily there)."""
    if name in __all__:
        return getattr(flops, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
