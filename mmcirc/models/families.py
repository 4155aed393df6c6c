"""The one table of mmcirc's backbone families: :data:`FAMILIES` maps a family
(``'pvt'``, ``'swin'``, ``'deit'``, ``'veca'``) to its backbone classes, the family's
base class first (``CAPVT``, ``CorePVT``; ``CASwin``, ``CoreSwin``; ``CADeiT``;
``VECAViT``). A class enters it where it is defined, with :func:`register_family`, as
does a subclass that adds an attention kind (``family`` names its family); the
converters, the backbone overrides and timm read it. Torch only: it imports nothing.
"""

from typing import Dict, List

__all__ = ['FAMILIES', 'attention_blocks', 'pyramid_families', 'register_family']

#: family -> its backbone classes, in the order they were added (the base class first).
FAMILIES: Dict[str, List[type]] = {}


def register_family(cls: type) -> type:
    """Add ``cls`` to ``FAMILIES[cls.family]`` (once); returns ``cls`` (a decorator)."""
    classes = FAMILIES.setdefault(cls.family, [])
    if cls not in classes:
        classes.append(cls)
    return cls


def pyramid_families() -> Dict[str, List[type]]:
    """The families whose backbones take attention kinds per stage (the pyramids:
    their classes have ``attention_blocks``)."""
    return {f: c for f, c in FAMILIES.items() if hasattr(c[0], 'attention_blocks')}


def attention_blocks() -> Dict[str, type]:
    """``{kind: block class}`` of every kind a pyramid of the table takes, in table
    order (a kind that several families take: its first block)."""
    out: Dict[str, type] = {}
    for classes in pyramid_families().values():
        for cls in classes:
            for kind, block in cls.attention_blocks.items():
                out.setdefault(kind, block)
    return out
