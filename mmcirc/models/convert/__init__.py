"""Checkpoint converters: released PVT, Swin, CA-DeiT and VECA weights to mmcirc models
(their commands: :mod:`mmcirc.cli.convert`, ``tools/model_converters/*_to_mmcirc.py``).

They import the backbones where they build a target, never the reverse. The shared
machinery is :mod:`.conversion`; each family's converter is its module (:mod:`.pvt`,
:mod:`.swin`, sharing :mod:`.pyramid`; :mod:`.deit`; :mod:`.veca`), entered in the
family table (:func:`mmcirc.models.families.register_converter`); :func:`convert_file`
converts a file for any family. Torch alone.
"""

from .conversion import *  # noqa: F403
from .conversion import __all__  # noqa: E402
from . import pvt, swin, deit, veca  # noqa: E402,F401  (their converters enter the table)
from .files import convert_file  # noqa: E402

__all__ = [*__all__, 'convert_file']
