"""Checkpoint converters: released PVT, Swin, CA-DeiT and VECA weights to mmcirc models
(``tools/model_converters/*_to_mmcirc.py``, entry points of :mod:`.cli`).

The shared core is :mod:`.core` (safe loading, unwrapping, provenance, the one result
type, report and file-to-file entry point :func:`convert_file`); each family's source
layouts live beside its backbone (:data:`FAMILIES`: ``mmcirc/models/backbones/
{pvt,swin,deit,veca}_convert.py``, with what the pyramids share in
``pyramid_convert.py``). The families' public functions are also reachable from here
(imported when first used: this package needs torch alone).
"""

import importlib

from .core import (  # noqa: F401
    ARCH_LETTERS,
    FAMILIES,
    OUTPUT_ROOT,
    CheckpointKindError,
    ConversionError,
    ConversionResult,
    ReleasedKind,
    build_result,
    convert_file,
    expect_released,
    family_converter,
    format_summary,
    load_source,
    save_checkpoint,
    strip_common_prefix,
    tensors_of,
    trace_provenance,
    unwrap_state_dict,
)
from .core import __all__ as _core_all

_BACKBONES = 'mmcirc.models.backbones.'
#: name -> module of the families' public functions re-exported here.
_FAMILY_EXPORTS = {
    **dict.fromkeys(
        (
            'build_backbone',
            'convert_pyramid',
            'default_output_path',
            'detect_layout',
            'family_of',
            'layouts_of',
            'replaced_attention_keys',
            'to_mmcirc_keys',
        ),
        _BACKBONES + 'pyramid_convert',
    ),
    **dict.fromkeys(
        ('CADEIT_BLOCK_KEY_MAP', 'cadeit_arch_of', 'convert_cadeit', 'convert_cadeit_official'),
        _BACKBONES + 'deit_convert',
    ),
    **dict.fromkeys(
        ('VECA_FAMILIES', 'convert_veca_official', 'veca_settings_of'), _BACKBONES + 'veca_convert'
    ),
}

__all__ = list(_core_all) + list(_FAMILY_EXPORTS)


def __getattr__(name):
    if name in _FAMILY_EXPORTS:
        return getattr(importlib.import_module(_FAMILY_EXPORTS[name]), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
