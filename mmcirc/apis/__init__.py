"""Inference helpers built on the OpenMMLab APIs (mmseg's ``init_model`` and its
whole-image inference). ``import mmcirc.apis`` needs mmseg; ``import mmcirc`` does not
import this package."""
from .highres import (BACKBONE_OVERRIDES, DEMO_IMAGES, HighResResult, apply_backbone_overrides,
                      build_segmentor, demo_image, figures_markdown, load_highres_config,
                      parse_size, predict_labels, quadratic_attention_estimates, read_image,
                      resize_image, run_dense_baseline, upsample_argmax, validate_overrides)

__all__ = [
    'BACKBONE_OVERRIDES', 'DEMO_IMAGES', 'HighResResult', 'apply_backbone_overrides',
    'build_segmentor', 'demo_image', 'figures_markdown', 'load_highres_config', 'parse_size',
    'predict_labels', 'quadratic_attention_estimates', 'read_image', 'resize_image',
    'run_dense_baseline', 'upsample_argmax', 'validate_overrides'
]
