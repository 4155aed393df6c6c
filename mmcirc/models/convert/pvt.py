"""PVT v1 checkpoints for CA-PVT / Core-PVT (``tools/model_converters/pvt_to_mmcirc.py``):
the source layouts, how to tell them apart and how their keys map to :class:`CAPVT`'s
(the shared checks and report: :mod:`.pyramid`).

* ``'official'`` (github.com/whai362/PVT: ``patch_embed1.proj``, ``pos_embed1``,
  ``block1.0.attn.q`` / ``.kv`` / ``.sr``, ``norm``, ``cls_token``, ``head``): mmdet's
  ``pvt_convert`` to mmdet's ``PyramidVisionTransformer`` layout, then
  :func:`convert_mmdet_pvt_keys`.
* ``'mmdet'`` (``PyramidVisionTransformer``, e.g. a whole detector, ``backbone.``
  prefixed): :func:`convert_mmdet_pvt_keys` (:data:`MMDET_PVT_KEY_MAP`).
* ``'mmcirc'``: already :class:`CAPVT`'s keys.

Position tables of another image size are resized (bilinear, mmdet's
``AbsolutePositionEmbedding``) when asked (:func:`resize_position_table`).
"""

import math
import re
import sys
from collections import OrderedDict
from functools import partial

import torch

from ..families import register_converter
from .conversion import ConversionError
from .pyramid import convert_source

__all__ = [
    'LAYOUTS',
    'LAYOUT_PATTERNS',
    'MMDET_PVT_KEY_MAP',
    'convert_mmdet_pvt_keys',
    'key_converter',
    'resize_position_table',
]

#: Source layouts (``'auto'`` detects one of them).
LAYOUTS = ('official', 'mmdet', 'mmcirc')
LAYOUT_NOTE = ' (mmpretrain and mmseg have no PVT v1)'

#: (layout, regex of a key only that layout has); the first match wins.
LAYOUT_PATTERNS = (
    ('official', r'^(patch_embed\d+\.proj\.|block\d+\.\d+\.(attn|mlp)\.|pos_embed\d+$)'),
    ('mmcirc', r'^layers\.\d+\.patch_embed\.projection\.'),
    ('mmdet', r'^layers\.\d+\.0\.projection\.'),
)

#: The target keys of the position tables (resized on request).
POSITION_TABLE = r'^layers\.\d+\.pos_embed\.pos_embed$'

#: (regex, replacement) pairs for the non-block keys of mmdet's PyramidVisionTransformer;
#: block keys ``layers.{i}.1.{j+1}.`` become ``layers.{i}.blocks.{j}.`` (see
#: :func:`convert_mmdet_pvt_keys`). The renames, mmdet -> ours::
#:
#:     layers.{i}.0.*                       layers.{i}.patch_embed.*
#:     layers.{i}.1.0.pos_embed             layers.{i}.pos_embed.pos_embed
#:     layers.{i}.1.{j+1}.*                 layers.{i}.blocks.{j}.*      (same inner keys:
#:                                          norm1, attn.attn.in_proj_*, attn.sr, attn.norm,
#:                                          norm2, ffn.layers.{0,3})
#:     layers.{i}.2.*  (norm_after_stage)   layers.{i}.norm.*
MMDET_PVT_KEY_MAP = (
    (r'^layers\.(\d+)\.0\.', r'layers.\1.patch_embed.'),
    (r'^layers\.(\d+)\.1\.0\.pos_embed$', r'layers.\1.pos_embed.pos_embed'),
    (r'^layers\.(\d+)\.2\.', r'layers.\1.norm.'),
)
_BLOCK_KEY = re.compile(r'^layers\.(\d+)\.1\.(\d+)\.')


def convert_mmdet_pvt_keys(state_dict, use_abs_pos_embed=True):
    """Rename the keys of an mmdet ``PyramidVisionTransformer`` state dict (no
    ``backbone.`` prefix) to :class:`CAPVT` keys; values are untouched."""
    out = {}
    for key, value in state_dict.items():
        new = key
        for pattern, repl in MMDET_PVT_KEY_MAP:
            new = re.sub(pattern, repl, new)
        m = _BLOCK_KEY.match(new)
        if m:
            j = int(m.group(2)) - int(bool(use_abs_pos_embed))
            new = f'layers.{m.group(1)}.blocks.{j}.' + new[m.end() :]
        out[new] = value
    return out


def _mmdet_to_mmcirc(sd):
    has_pos = any(re.match(r'^layers\.\d+\.1\.0\.pos_embed$', k) for k in sd)
    return OrderedDict(convert_mmdet_pvt_keys(sd, use_abs_pos_embed=has_pos))


def _official_to_mmcirc(sd):
    from mmdet.models.backbones.pvt import pvt_convert

    return _mmdet_to_mmcirc(pvt_convert(sd))


def key_converter(layout: str):
    """``convert(state_dict) -> state_dict in CAPVT's keys`` for a source layout."""
    return {'official': _official_to_mmcirc, 'mmdet': _mmdet_to_mmcirc}.get(layout, OrderedDict)


def resize_position_table(key: str, value: torch.Tensor, model) -> torch.Tensor:
    """The position table ``value`` (1, h*w, C) of a square grid, resized (bilinear) to
    the grid of the model's stage that ``key`` names."""
    from mmdet.models.backbones.pvt import AbsolutePositionEmbedding

    stage = model.stages[int(key.split('.')[1])]
    side = math.isqrt(value.shape[1])
    if side * side != value.shape[1]:
        raise ConversionError(
            f'{key}: cannot resize a position table of {value.shape[1]} tokens (not a square grid)'
        )
    src = AbsolutePositionEmbedding(pos_shape=(side, side), pos_dim=value.shape[2])
    return src.resize_pos_embed(value.float(), tuple(stage.pos_embed.pos_shape)).to(value.dtype)


register_converter('pvt', partial(convert_source, 'pvt'), layouts=sys.modules[__name__])
