"""Swin checkpoints for CA-Swin / Core-Swin (``tools/model_converters/swin_to_mmcirc.py``):
the source layouts, how to tell them apart and how their keys map to :class:`CASwin`'s
(the shared checks and report: :mod:`.pyramid`).

* ``'official'`` (github.com/microsoft/Swin-Transformer: ``patch_embed.proj``,
  ``layers.{i}.blocks.{j}.attn.qkv``, ``layers.{i}.downsample.reduction``, ``norm``,
  ``head``): mmdet's ``swin_converter`` to mmdet's ``SwinTransformer`` layout (equal to
  ours; it also reorders the patch-merging weights for mmcv's unfold). One addition, the
  convention of mmpretrain's Swin checkpoints: the official final LN ``norm`` (on the
  last stage's output) becomes ``norm{last}``; mmdet drops it.
* ``'mmdet'``, ``'mmseg'``, ``'mmpretrain'``, ``'mmcirc'``: one and the same key space
  (e.g. a whole detector, ``backbone.`` prefixed), taken as it is.
"""

import re
import sys
from collections import OrderedDict
from functools import partial

from ..families import register_converter
from .pyramid import convert_source

__all__ = ['LAYOUTS', 'LAYOUT_PATTERNS', 'key_converter']

#: Source layouts (``'auto'`` detects one of them); all but the official one share keys.
LAYOUTS = ('official', 'mmdet', 'mmseg', 'mmpretrain', 'mmcirc')
LAYOUT_NOTE = ''

#: (layout, regex of a key only that layout has); the first match wins.
LAYOUT_PATTERNS = (
    ('official', r'^(layers\.\d+\.blocks\.\d+\.mlp\.fc1\.|patch_embed\.proj\.)'),
    ('mmdet', r'^(stages\.\d+\.blocks\.|patch_embed\.projection\.)'),
)

#: Swin has no absolute position tables.
POSITION_TABLE = None


def _official_to_mmdet(sd):
    """mmdet's ``swin_converter``, then the official final LN ``norm`` -> ``norm{last}``
    (mmpretrain's convention)."""
    from mmdet.models.backbones.swin import swin_converter

    out = OrderedDict((k[len('backbone.') :], v) for k, v in swin_converter(sd).items())
    stages = [int(m.group(1)) for m in (re.match(r'^stages\.(\d+)\.', k) for k in out) if m]
    if stages:
        last = max(stages)
        out = OrderedDict((re.sub(r'^norm\.', f'norm{last}.', k), v) for k, v in out.items())
    return out


def key_converter(layout: str):
    """``convert(state_dict) -> state_dict in CASwin's keys`` for a source layout."""
    return _official_to_mmdet if layout == 'official' else OrderedDict


register_converter('swin', partial(convert_source, 'swin'), layouts=sys.modules[__name__])
