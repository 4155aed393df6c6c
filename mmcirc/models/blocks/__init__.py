"""Pyramid blocks, one registered module per attention kind (see :mod:`.base`).

A new attention = an operator (``mmcirc/ops``) + a block file here, registered with
:func:`mmcirc.registry.register_model` and declaring its ``kind``; the pyramids, the
high-res overrides, the converters and the tools find it in the registry, and the
analysis (attention capture, FLOPs) asks its ``attention_probes`` (:mod:`.probe`);
the dense attention of other libraries is seen through :mod:`.dense_probes`.
"""

from .base import PyramidBlock, attention_kinds, block_class, block_classes
from .circulant import CirculantBlock
from .core import CoreBlock
from .dense_probes import MHAProbe, ViTProbe
from .probe import AttentionProbe, attention_probes, probe_of, register_attention_probe
from .sra import SRABlock
from .window import WindowBlock

__all__ = [
    'AttentionProbe',
    'MHAProbe',
    'ViTProbe',
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
