"""mmcirc: circulant- and core-attention backbones for mmdet, mmseg and mmpretrain.

``import mmcirc`` (what ``custom_imports`` in the configs does) registers the backbones
and hooks into the MODELS/HOOKS registries of the three libraries and changes nothing
else in mmengine. Safe checkpoint loading and atomic checkpoint saving are opt-in:
``SafeCheckpointIOHook`` in a config (every config mmcirc ships has it) or the calls in
:mod:`mmcirc.engine.checkpoint`. ``mmcirc.ops`` (the attention operators)
needs torch alone: without mmengine installed, only that part is available. mmdet is
required for the models (their PVT and Swin blocks reuse its layers): without it,
``import mmcirc.models`` says which package to install. mmseg and mmpretrain are
optional: the models are registered into whichever of them is installed, and a
detection user's ``import mmcirc`` never imports mmseg or mmpretrain.
"""

import importlib.util

from .version import __version__  # noqa: F401

if importlib.util.find_spec('mmengine') is not None:
    from . import engine  # noqa: F401  (hooks, registered in mmengine's root)

    if importlib.util.find_spec('mmdet') is not None:
        from . import models  # noqa: F401  (registration)
