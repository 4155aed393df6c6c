"""Backbones (and necks) registered into mmdet, mmseg and mmpretrain."""

from mmcirc.registry import registries_by_library

registries_by_library()  # first: without mmdet, one error naming the package to install
from .backbones import *  # noqa: F401,F403
from .necks import *  # noqa: F401,F403
from . import baselines  # noqa: F401  (registers the benchmarks' baseline attention)
