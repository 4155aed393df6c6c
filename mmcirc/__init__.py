"""mmcirc: circulant- and core-attention backbones for mmdet, mmseg and mmpretrain.

``import mmcirc`` (what ``custom_imports`` in the configs does) registers the backbones
and hooks into the MODELS/HOOKS registries of the libraries installed
(:mod:`mmcirc.registry`) and changes nothing else in mmengine (safe checkpoint I/O is
opt-in: :mod:`mmcirc.engine.checkpoint`). ``mmcirc.ops`` (the attention operators) needs
torch alone; without mmdet, ``import mmcirc.models`` says which package to install.
"""

import importlib.util

from .version import __version__  # noqa: F401

if importlib.util.find_spec('mmengine') is not None:
    from . import engine  # noqa: F401  (hooks, registered in mmengine's root)

    if importlib.util.find_spec('mmdet') is not None:
        from . import models  # noqa: F401  (registration)
