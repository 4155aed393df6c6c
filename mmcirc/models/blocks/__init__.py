"""Pyramid blocks, one registered module per attention kind (see :mod:`.base`).

A new attention = an operator (``mmcirc/ops``) + a block file here, registered with
:func:`mmcirc.registry.register_model` and declaring its ``kind``; the pyramids, the
high-res overrides, the converters and the tools find it in the registry, and the
analysis (attention capture, FLOPs) asks its ``attention_probes`` (:mod:`.probe`).
"""

from .base import PyramidBlock, attention_kinds, block_class, block_classes
from .circulant import CirculantBlock
from .core import CoreBlock
from .probe import AttentionProbe, attention_probes, probe_of, register_attention_probe
from .sra import SRABlock
from .window import WindowBlock

__all__ = [
    'AttentionProbe',
    'attention_probes',
    'probe_of',
    'register_attention_probe',
    'PyramidBlock',
    'attention_kinds',
    'block_class',
    'block_classes',
    'CirculantBlock',
    'CoreBlock',
    'SRABlock',
    'WindowBlock',
]
