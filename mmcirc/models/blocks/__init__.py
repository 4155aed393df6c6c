"""Pyramid blocks, one registered module per attention kind (see :mod:`.base`).

A new attention = an operator (``mmcirc/ops``) + a block file here, registered with
:func:`mmcirc.registry.register_model` and declaring its ``kind``; the pyramids, the
high-res overrides, the converters and the tools find it in the registry.
"""

from .base import PyramidBlock, attention_kinds, block_class, block_classes
from .circulant import CirculantBlock
from .core import CoreBlock
from .sra import SRABlock
from .window import WindowBlock

__all__ = [
    'PyramidBlock',
    'attention_kinds',
    'block_class',
    'block_classes',
    'CirculantBlock',
    'CoreBlock',
    'SRABlock',
    'WindowBlock',
]
