"""Checkpoint converters: released PVT, Swin, CA-DeiT and VECA weights to mmcirc models
(their commands: :mod:`mmcirc.cli.convert`, ``tools/model_converters/*_to_mmcirc.py``).

The shared machinery is :mod:`.conversion` (safe loading, unwrapping, provenance, the one
result type, report and file-to-file entry point :func:`convert_file`); each family's source
layouts live beside its backbone (:data:`FAMILIES`: ``mmcirc/models/backbones/
{pvt,swin,deit,veca}_convert.py``, with what the pyramids share in
``pyramid_convert.py``). This package needs torch alone.
"""

from .conversion import (  # noqa: F401
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
    shape_mismatches,
    strip_common_prefix,
    tensors_of,
    trace_provenance,
    unwrap_state_dict,
)
from .conversion import __all__  # noqa: F401,E402
