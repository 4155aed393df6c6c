"""What a model computes, inspected without timing it: FLOPs under mmcirc's convention
(:mod:`.flops`, :mod:`.flop_handles`), the attention maps a model really uses
(:mod:`.attention_maps`) and their BCCB scores (:mod:`.bccb`), the memory of quadratic
attention at an image size (:mod:`.attention_memory`) and what the visualisation tools
need (:mod:`.vis`). Time and peak memory measured are :mod:`mmcirc.benchmark`'s; the
commands of both are ``tools/analysis/*.py`` (as mmdet's ``tools/analysis_tools/``),
entry points of :mod:`mmcirc.cli`. The package's names are those of :mod:`.flops`."""

from . import flops
from .flops import __all__  # noqa: F401


def __getattr__(name):
    """The public names of :mod:`.flops` (``FlopCounter`` is built lazily there)."""
    if name in __all__:
        return getattr(flops, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
