"""The one table of mmcirc's backbone families: :data:`FAMILIES` maps a family
(``'pvt'``, ``'swin'``, ``'deit'``, ``'veca'``) to its :class:`Family` row: its backbone
classes, the base class first (``CAPVT``, ``CorePVT``; ``CASwin``, ``CoreSwin``;
``CADeiT``; ``VECAViT``), entered where each is defined (:func:`register_family`, as does
a subclass that adds an attention kind), and its converter, entered where it is defined
(:func:`register_converter`, ``mmcirc/models/convert``). The converters, the backbone
overrides and timm read it. Torch only: it imports nothing.
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

__all__ = [
    'FAMILIES',
    'Family',
    'attention_blocks',
    'converters',
    'pyramid_families',
    'register_converter',
    'register_family',
]


@dataclass
class Family:
    """A row of :data:`FAMILIES`: the family's backbone classes in the order they were
    added; its converter, ``convert(src, load, meta, **options) -> (result, default_out,
    title)`` (:func:`mmcirc.models.convert.convert_file`); a pyramid's source layouts
    (the module of its key converters)."""

    classes: List[type] = field(default_factory=list)
    convert: Optional[Callable] = None
    layouts: Optional[object] = None


#: family -> its row, in the order the families were added.
FAMILIES: Dict[str, Family] = {}


def register_family(cls: type) -> type:
    """Add ``cls`` to ``FAMILIES[cls.family].classes`` (once); returns ``cls`` (a decorator)."""
    classes = FAMILIES.setdefault(cls.family, Family()).classes
    if cls not in classes:
        classes.append(cls)
    return cls


def register_converter(family: str, convert: Callable, layouts=None) -> None:
    """Set the converter columns of ``family`` (see :class:`Family`)."""
    row = FAMILIES.setdefault(family, Family())
    row.convert, row.layouts = convert, layouts


def converters() -> Dict[str, Callable]:
    """``{family: convert}`` of the families with a converter, in table order."""
    return {f: row.convert for f, row in FAMILIES.items() if row.convert is not None}


def pyramid_families() -> Dict[str, List[type]]:
    """The families whose backbones take attention kinds per stage (the pyramids:
    their classes have ``attention_blocks``) -> their classes."""
    return {
        f: row.classes
        for f, row in FAMILIES.items()
        if row.classes and hasattr(row.classes[0], 'attention_blocks')
    }


def attention_blocks() -> Dict[str, type]:
    """``{kind: block class}`` of every kind a pyramid of the table takes, in table
    order (a kind that several families take: its first block)."""
    out: Dict[str, type] = {}
    for classes in pyramid_families().values():
        for cls in classes:
            for kind, block in cls.attention_blocks.items():
                out.setdefault(kind, block)
    return out
