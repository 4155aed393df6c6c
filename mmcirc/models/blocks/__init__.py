"""Pyramid blocks, one registered module per attention kind (see :mod:`.pyramid_blocks`).

The blocks mmcirc adds (``CirculantBlock``, ``CoreBlock``) and the parts they share are
in :mod:`.pyramid_blocks`; mmdet's own blocks of the two families, with the block
declarations, in :mod:`.sra` (PVT) and :mod:`.window` (Swin). A new attention = an
operator (``mmcirc/ops``) declaring its attention (``attention_kind``, :mod:`.probe`) or
a registered probe + a block declaring its ``kind`` + an entry in a family's ``attention_blocks`` (a registered
subclass of :class:`~mmcirc.models.backbones.CAPVT` / ``CASwin``); the dense attention of
other libraries is seen through :mod:`.dense_probes`.
"""

from .probe import AttentionProbe, attention_probes, probe_of, register_attention_probe
from .pyramid_blocks import CirculantBlock, CoreBlock, PyramidBlock
from .sra import SRABlock
from .window import WindowBlock

# registered last: the dense probes match what no block's probe took (mmdet's
# spatial-reduction attention is an mmcv MultiheadAttention too)
from .dense_probes import MHAProbe, ViTProbe  # noqa: E402

#: The blocks of mmcirc's pyramid families (their fx leaves, the kinds whose attention is
#: quadratic); a family says which of them it takes.
PYRAMID_BLOCKS = (CirculantBlock, CoreBlock, SRABlock, WindowBlock)

__all__ = [
    'AttentionProbe',
    'MHAProbe',
    'ViTProbe',
    'PYRAMID_BLOCKS',
    'attention_probes',
    'probe_of',
    'register_attention_probe',
    'PyramidBlock',
    'CirculantBlock',
    'CoreBlock',
    'SRABlock',
    'WindowBlock',
]
