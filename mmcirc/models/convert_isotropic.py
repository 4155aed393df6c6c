"""The converters of the released isotropic models under their former import path:
CA-DeiT in :mod:`mmcirc.models.backbones.deit_convert`, VECA in
:mod:`mmcirc.models.backbones.veca_convert` (torch only)."""

from mmcirc.models.backbones.deit_convert import cadeit_arch_of, convert_cadeit_official
from mmcirc.models.backbones.veca_convert import (
    VECA_FAMILIES,
    convert_veca_official,
    veca_settings_of,
)
from mmcirc.models.convert.core import CheckpointKindError

__all__ = [
    'CheckpointKindError',
    'VECA_FAMILIES',
    'cadeit_arch_of',
    'convert_cadeit_official',
    'convert_veca_official',
    'veca_settings_of',
]
