"""Checkpoint converters: released PVT, Swin, CA-DeiT and VECA weights to mmcirc models
(their commands: :mod:`mmcirc.cli.convert`, ``tools/model_converters/*_to_mmcirc.py``).

The shared machinery is :mod:`.conversion` (safe loading, unwrapping, provenance, the one
result type, report); each family's source layouts live beside its backbone
(``mmcirc/models/backbones/{pvt,swin,deit,veca}_convert.py``, with what the pyramids share
in ``pyramid_convert.py``), which import it; :mod:`.files` converts a file for any family
(:func:`convert_file`, :data:`CONVERTERS`). This package needs torch alone.
"""

from .conversion import *  # noqa: F403
from .conversion import __all__  # noqa: E402
from .files import CONVERTERS, convert_file  # noqa: E402

__all__ = [*__all__, 'CONVERTERS', 'convert_file']
