"""One registration helper for the three OpenMMLab libraries mmcirc plugs into.

A backbone written here is used from mmdet configs (detection), mmseg configs
(segmentation) and mmpretrain configs (ImageNet pretraining). Each library has its own
``MODELS`` registry, so :func:`register_model` puts a class into all three at once,
under one name, and refuses a name that any of them (or mmengine's root registry,
which they inherit from) already holds.
"""
from typing import List, Optional

from mmengine.registry import Registry


def model_registries() -> List[Registry]:
    """The ``MODELS`` registries of mmdet, mmseg and mmpretrain, in that order."""
    from mmdet.registry import MODELS as MMDET_MODELS
    from mmpretrain.registry import MODELS as MMPRETRAIN_MODELS
    from mmseg.registry import MODELS as MMSEG_MODELS
    return [MMDET_MODELS, MMSEG_MODELS, MMPRETRAIN_MODELS]


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
                f"clashes with {getattr(owner, '__module__', '?')}.{getattr(owner, '__name__', owner)} "
                f"already registered in the {scope!r} MODELS registry; choose another name "
                f"(e.g. prefix it with 'CA' or 'Core')")
        for registry in registries:
            if registry.module_dict.get(key) is not module:
                registry.register_module(name=key, module=module)
        return module

    if cls is not None:
        return _register(cls)
    return _register
