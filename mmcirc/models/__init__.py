"""Backbones (and necks) registered into mmdet, mmseg and mmpretrain; without mmengine
(a torch-only install) nothing is registered (see :mod:`mmcirc.models.backbones`). With
mmengine, mmdet is required.
"""

import importlib.util

if importlib.util.find_spec('mmengine') is not None:
    from mmcirc.registry import registries_by_library

    registries_by_library()  # first: without mmdet, one error naming the package to install
    from .backbones import *  # noqa: F401,F403
    from .necks import *  # noqa: F401,F403
