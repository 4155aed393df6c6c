"""Inference helpers built on the OpenMMLab APIs (mmseg's ``init_model`` and its
whole-image inference). ``import mmcirc.apis`` needs mmseg; ``import mmcirc`` does not
import this package. The command line around them is ``tools/infer_highres.py``."""

from .highres import (
    BACKBONE_OVERRIDES,
    OVERRIDE_KEYS,
    UPSAMPLE_MODES,
    HighResResult,
    apply_backbone_overrides,
    backbone_overrides_of,
    backbone_summary,
    build_segmentor,
    is_out_of_memory,
    load_highres_config,
    min_input_size,
    overridable_backbones,
    predict_labels,
    progress_units,
    quadratic_attention_estimates,
    quadratic_warning,
    run_image,
    upsample_argmax,
    validate_overrides,
)

__all__ = [
    'BACKBONE_OVERRIDES',
    'OVERRIDE_KEYS',
    'UPSAMPLE_MODES',
    'HighResResult',
    'apply_backbone_overrides',
    'backbone_overrides_of',
    'backbone_summary',
    'build_segmentor',
    'is_out_of_memory',
    'load_highres_config',
    'min_input_size',
    'overridable_backbones',
    'predict_labels',
    'progress_units',
    'quadratic_attention_estimates',
    'quadratic_warning',
    'run_image',
    'upsample_argmax',
    'validate_overrides',
]
