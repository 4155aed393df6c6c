"""Backbones (and necks) registered into mmdet, mmseg and mmpretrain.

Without mmengine (a torch-only install, e.g. the GPU benchmark machine) nothing is
registered and only the torch-only model files import: ``mmcirc.models.backbones.ca_deit``
and ``.veca`` (see :mod:`mmcirc.models.backbones`). With mmengine, mmdet is required:
``import mmcirc.models`` without it is one error naming the package to install.
"""

import importlib.util

if importlib.util.find_spec('mmengine') is not None:
    from mmcirc.registry import registries_by_library

    registries_by_library()  # first: without mmdet, one error naming the package to install
    from .backbones import *  # noqa: F401,F403
    from .necks import *  # noqa: F401,F403
