"""Circulant- and core-attention PVT and Swin pyramids (registered into the MODELS
registries of mmdet, mmseg and mmpretrain)."""

from .ca_deit import CADeiT
from .ca_pvt import CAPVT, CorePVT
from .ca_swin import CASwin, CoreSwin
from .pyramid import CORE_PRESETS, CirculantBlock, CoreBlock, PyramidBackbone, PyramidStage
from .veca import VECAViT

__all__ = [
    'CAPVT',
    'CorePVT',
    'CASwin',
    'CoreSwin',
    'CORE_PRESETS',
    'CirculantBlock',
    'CoreBlock',
    'PyramidBackbone',
    'PyramidStage',
    'CADeiT',
    'VECAViT',
]
