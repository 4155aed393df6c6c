"""mmcirc's backbones (registered into the MODELS registries of mmdet, mmseg and
mmpretrain), all keeping one contract (:mod:`.contract`). The pyramids reuse mmcv / mmdet
layers and are imported only where mmengine is installed; the isotropic models
(:class:`CADeiT`, :class:`VECAViT`) need torch only (unregistered without mmengine).
"""

import importlib.util

from mmcirc.ops.core import CORE_PRESETS

__all__ = ['CADeiT', 'CORE_PRESETS', 'VECAViT']

if importlib.util.find_spec('mmengine') is not None:  # registered first: the pyramids
    from .ca_pvt import CAPVT, CorePVT
    from .ca_swin import CASwin, CoreSwin
    from ..blocks import CirculantBlock, CoreBlock
    from .pyramid import PyramidBackbone, PyramidStage

    __all__ += [
        'CAPVT',
        'CorePVT',
        'CASwin',
        'CoreSwin',
        'CirculantBlock',
        'CoreBlock',
        'PyramidBackbone',
        'PyramidStage',
    ]

from .ca_deit import CADeiT  # noqa: E402  (torch only)
from .veca import VECAViT  # noqa: E402  (torch only)
