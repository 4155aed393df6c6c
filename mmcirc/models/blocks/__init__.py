"""Pyramid blocks, one registered module per attention kind: mmcirc's in
:mod:`.pyramid_blocks`, mmdet's own with the block declarations in :mod:`.sra` (PVT) and
:mod:`.window` (Swin). A new attention = an operator (``mmcirc/ops``) declaring its
attention (``attention_kind``, see :mod:`mmcirc.analysis.probes`) + a block declaring its
``kind`` + an entry in a family's ``attention_blocks`` (a subclass of
:class:`~mmcirc.models.backbones.CAPVT` / ``CASwin``).
"""

from .pyramid_blocks import CirculantBlock, CoreBlock, PyramidBlock, StageOptions
from .sra import SRABlock
from .window import WindowBlock

__all__ = [
    'PyramidBlock',
    'StageOptions',
    'CirculantBlock',
    'CoreBlock',
    'SRABlock',
    'WindowBlock',
]
