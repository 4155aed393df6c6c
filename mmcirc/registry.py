"""One registration helper for the three OpenMMLab libraries mmcirc plugs into: each has
its own ``MODELS`` registry, and :func:`register_model` puts a class into all of them that
are installed (mmdet is required, mmseg and mmpretrain optional) under one name.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:  # mmengine is imported with the libraries, not by this module
    from mmengine.registry import Registry

#: The libraries mmcirc registers into, in this order. mmdet is required (the PVT and
#: Swin blocks reuse its layers); mmseg and mmpretrain are used when they are installed.
LIBRARIES = ('mmdet', 'mmseg', 'mmpretrain')
_MMDET_PIP = 'mmdet==3.3.0'  # as pinned in requirements.txt


@functools.lru_cache(maxsize=None)
def _library_models(library: str) -> Optional[Registry]:
    """``library.registry.MODELS``, or None when ``library`` is not installed."""
    if importlib.util.find_spec(library) is None:
        if library == 'mmdet':
            raise ModuleNotFoundError(
                f"mmcirc needs mmdet (its PVT and Swin blocks reuse mmdet's layers): "
                f"pip install '{_MMDET_PIP}'",
                name='mmdet',
            )
        return None
    return importlib.import_module(f'{library}.registry').MODELS


def registries_by_library() -> Dict[str, Registry]:
    """``{library: MODELS}`` for mmdet and whichever of mmseg / mmpretrain are installed
    (only those are imported)."""
    found = {lib: _library_models(lib) for lib in LIBRARIES}
    return {lib: reg for lib, reg in found.items() if reg is not None}


def model_registries() -> List[Registry]:
    """The installed ``MODELS`` registries among mmdet, mmseg and mmpretrain, in that order
    (mmdet always first)."""
    return list(registries_by_library().values())


def _holder(registry: Registry, name: str):
    """(scope, object) of the registry or ancestor that owns ``name``, else None."""
    while registry is not None:
        if name in registry.module_dict:
            return registry.scope, registry.module_dict[name]
        registry = registry.parent
    return None


def register_model(cls=None, *, name: Optional[str] = None):
    """Register ``cls`` in the MODELS registries of mmdet, mmseg and mmpretrain.

    Use as ``@register_model()`` / ``@register_model(name='X')`` or call
    ``register_model(SomeClass)``. Registering the same class twice is a no-op
    (module reloads); any other clash raises ``KeyError`` naming the registry that
    holds the name, and nothing is registered anywhere (all-or-nothing).
    """

    def _register(module):
        key = name or module.__name__
        registries = model_registries()
        for registry in registries:
            held = _holder(registry, key)
            if held is None or held[1] is module:
                continue
            scope, owner = held
            raise KeyError(
                f'register_model: name {key!r} for {module.__module__}.{module.__qualname__} '
                f'clashes with {getattr(owner, "__module__", "?")}.{getattr(owner, "__name__", owner)} '
                f'already registered in the {scope!r} MODELS registry; choose another name '
                f"(e.g. prefix it with 'CA' or 'Core')"
            )
        for registry in registries:
            if registry.module_dict.get(key) is not module:
                registry.register_module(name=key, module=module)
        return module

    if cls is not None:
        return _register(cls)
    return _register
