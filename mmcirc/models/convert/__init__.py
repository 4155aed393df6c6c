"""Checkpoint converters: released PVT, Swin, CA-DeiT and VECA weights to mmcirc models
(their commands: :mod:`mmcirc.cli.convert`, ``tools/model_converters/*_to_mmcirc.py``).

All converters are here, and they import the backbones where they build a target,
never the reverse. The shared machinery is :mod:`.conversion` (safe loading,
unwrapping, provenance, the one result type, report); each family's converter is its
module (:mod:`.pvt` and :mod:`.swin`, their source layouts, with what the pyramids share
in :mod:`.pyramid` and :mod:`.pyramid_target`; :mod:`.deit`; :mod:`.veca`), which enters
it in the family table (:func:`mmcirc.models.families.register_converter`);
:mod:`.files` converts a file for any family (:func:`convert_file`). This package needs
torch alone.
"""

from .conversion import *  # noqa: F403
from .conversion import __all__  # noqa: E402
from . import pvt, swin, deit, veca  # noqa: E402,F401  (their converters enter the table)
from .files import convert_file  # noqa: E402

__all__ = [*__all__, 'convert_file']
