"""Necks registered into mmdet, mmseg and mmpretrain."""

from .simple_fpn import LayerNorm2d, SimpleFeaturePyramid

__all__ = ['SimpleFeaturePyramid', 'LayerNorm2d']
