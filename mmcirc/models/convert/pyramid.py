"""Checkpoints of PVT / Swin (and mmcirc's own) for the CA/Core pyramids: what the
pyramid families share (``tools/model_converters/{pvt,swin}_to_mmcirc.py``).

The circulant (or core) stages of CA-PVT / CA-Swin keep everything of PVT / Swin
except the attention (METHOD.md, "CA in pyramids"), so an ImageNet checkpoint of the
original pyramid initialises all of it but the replaced attention, as the blocks
declare it (:func:`.pyramid_target.replaced_attention_keys`); what the target cannot use
(stage 1-2 SRA / window attention, classifier head, ...) is reported as unused.

A family's source layouts are its module (:mod:`.pvt`, :mod:`.swin`: the ``layouts``
column of the family table); this module detects the layout, maps the keys with
provenance, checks every tensor against the target (:class:`ConversionError` naming the
tensor, both shapes and the archs that would fit) and gives the one
:class:`ConversionResult`, saved as ``{'state_dict': {backbone keys}, 'meta': {...}}``
(configs load it with ``init_cfg=dict(type='Pretrained', checkpoint=...)``).
"""

import os.path as osp
import re
from collections import OrderedDict
from typing import Optional, Sequence

from .conversion import (
    ARCH_LETTERS,
    OUTPUT_ROOT,
    ConversionError,
    ConversionResult,
    trace_provenance,
    unwrap_state_dict,
)
from .pyramid_target import build_backbone, describe, family_of, pyramid_result, pyramid_sources

__all__ = [
    'layouts_of',
    'detect_layout',
    'to_mmcirc_keys',
    'convert_pyramid',
    'default_output_path',
    'convert_source',
]


def _module(family: str):
    sources = pyramid_sources()
    if family not in sources:
        raise ConversionError(f'family must be one of {tuple(sources)}, got {family!r}')
    return sources[family]


def layouts_of(family: str) -> tuple:
    """The source layouts ``family`` accepts (``'auto'`` detects one of them)."""
    return _module(family).LAYOUTS


def detect_layout(family: str, state_dict) -> str:
    """The source layout of a (backbone) state dict: the first of the family's
    ``LAYOUT_PATTERNS`` one of its keys matches (for Swin, mmseg / mmpretrain / mmcirc
    read as ``'mmdet'``: the same key space)."""
    for layout, pattern in _module(family).LAYOUT_PATTERNS:
        if any(re.match(pattern, k) for k in state_dict):
            return layout
    raise ConversionError(
        f'cannot recognise the {family.upper()} checkpoint layout from its keys '
        f'{list(state_dict)[:6]}...; is it a {family.upper()} checkpoint? (or give src_layout)'
    )


def to_mmcirc_keys(family: str, state_dict, layout: str = 'auto') -> tuple:
    """``(mapped, provenance, layout)``: the source state dict in mmcirc's key space (by
    the layout's key converter), each mapped key's source keys, and the layout used."""
    module = _module(family)
    if layout == 'auto':
        layout = detect_layout(family, state_dict)
    if layout not in module.LAYOUTS:
        raise ConversionError(
            f'src_layout for {family.upper()} must be one of '
            f'{("auto",) + module.LAYOUTS}{module.LAYOUT_NOTE}, got {layout!r}'
        )
    convert = module.key_converter(layout)
    mapped = OrderedDict(convert(state_dict))
    return mapped, trace_provenance(convert, state_dict), layout


def _depths_widths(sd, attr: str) -> tuple:
    depths, widths = {}, {}
    for k, v in sd.items():
        m = re.match(rf'^{attr}\.(\d+)\.blocks\.(\d+)\.', k)
        if m:
            i, j = int(m.group(1)), int(m.group(2))
            depths[i] = max(depths.get(i, 0), j + 1)
            if j == 0 and k.endswith('.norm1.weight'):
                widths[i] = int(v.shape[0])
    n = max(depths) + 1 if depths else 0
    return (tuple(depths.get(i, 0) for i in range(n)), tuple(widths.get(i, 0) for i in range(n)))


def _arch_hint(model, depths, widths) -> str:
    fits = []
    for name in model.arch_zoo:
        a = model._parse_arch(name)
        if a['depths'] == depths and (not any(widths) or a['embed_dims'] == widths):
            fits.append(name)
    seen = f'the checkpoint has depths {depths}' + (f' and widths {widths}' if any(widths) else '')
    return seen + (
        f': use arch {" or ".join(repr(f) for f in fits)}' if fits else ' (no named arch fits)'
    )


def convert_pyramid(
    ckpt,
    model,
    src_layout: str = 'auto',
    resize_pos_embed: bool = False,
    meta: Optional[dict] = None,
) -> ConversionResult:
    """Convert a PVT or Swin checkpoint for ``model`` (a built CA/Core pyramid).

    Args:
        ckpt (dict): the loaded checkpoint (any wrapping, see :func:`unwrap_state_dict`).
        model: target :class:`CAPVT` / :class:`CASwin` (or Core*) instance.
        src_layout (str): ``'auto'`` or one of the family's layouts (:func:`layouts_of`).
        resize_pos_embed (bool): resize the position tables of another image size (the
            family's ``POSITION_TABLE`` keys, PVT's) to the model's; otherwise a size
            mismatch is an error.
        meta (dict, optional): extra entries for ``result.meta``.

    Every target key found in the mapped source must have the same shape, and the
    source's blocks per stage must equal the model's depths; else
    :class:`ConversionError`.
    """
    family = family_of(model)
    module = _module(family)
    sd, outside = unwrap_state_dict(ckpt)
    mapped, provenance, layout = to_mmcirc_keys(family, sd, src_layout)
    target = model.state_dict()
    attr = model.stages_attr

    depths, widths = _depths_widths(mapped, attr)
    if not depths:
        raise ConversionError(
            f'no {family.upper()} stage blocks in the checkpoint (read in the {layout} '
            f'layout; keys: {list(sd)[:6]}...)'
            + (
                '; for CA-DeiT use cadeit_to_mmcirc.py'
                if 'blocks.0.attn.gate.0.weight' in sd
                else ''
            )
        )
    if depths != tuple(model.depths):
        raise ConversionError(
            f'depth mismatch: {_arch_hint(model, depths, widths)}; the target is {describe(model)}'
        )

    table = module.POSITION_TABLE
    out, loaded_from, mismatches, resized = OrderedDict(), {}, [], []
    for key, value in mapped.items():
        if key not in target:
            continue
        want = target[key].shape
        if value.shape != want:
            if (
                resize_pos_embed
                and table is not None
                and re.match(table, key)
                and value.dim() == 3
                and value.shape[2] == want[2]
            ):
                value = module.resize_position_table(key, value, model)
                resized.append(key)
            else:
                mismatches.append(
                    f'  {key}: checkpoint {tuple(value.shape)} vs model {tuple(want)}'
                )
                continue
        out[key] = value
        loaded_from[key] = provenance[key]
    if not out and not mismatches:
        raise ConversionError(
            f'nothing in the checkpoint ({src_layout} layout read as {layout}) fits '
            f'{describe(model)}; keys: {list(sd)[:6]}...'
        )
    if mismatches:
        hint = _arch_hint(model, depths, widths)
        if any('pos_embed' in m for m in mismatches):
            hint += (
                '; position tables of another image size: build the target with its '
                'pretrain_img_size and pass resize_pos_embed=True'
            )
        shown = '\n'.join(mismatches[:6]) + (
            f'\n  ... and {len(mismatches) - 6} more' if len(mismatches) > 6 else ''
        )
        raise ConversionError(
            f'{len(mismatches)} tensor(s) of the checkpoint do not fit '
            f'{describe(model)}:\n{shown}\n{hint}'
        )
    return pyramid_result(model, out, loaded_from, list(sd) + outside, layout, resized, meta)


def default_output_path(
    model, arch, suffix: str = 'in1k', root: str = OUTPUT_ROOT, options: Optional[dict] = None
) -> str:
    """``{root}/{variant}[_{options}]_{suffix}.pth`` with the config names' variant,
    e.g. ``ca_pvt_s``, ``core_swin_t``; a non-default stage layout is spelled out
    (``pvt_s_circulant-circulant-circulant-sra``); the target's extra ``options`` (the
    backbone options) follow as ``key-value``, sorted (``core_pvt_t_num_cores_max-32``)."""
    family = family_of(model)
    letter = ARCH_LETTERS.get(arch, 'custom') if isinstance(arch, str) else 'custom'
    kinds = tuple(model.stage_attentions)
    k = model.num_replaced_stages
    extra = ''.join(
        '_' + re.sub(r'[^\w.-]+', '', f'{key}-{value}')
        for key, value in sorted((options or {}).items())
    )
    for kind, block in model.attention_blocks.items():  # a name's prefix: its blocks'
        paper = (kind,) * k + (model.original_attention,) * (len(kinds) - k)
        if block.variant_prefix and kinds == paper:
            return osp.join(root, f'{block.variant_prefix}_{family}_{letter}{extra}_{suffix}.pth')
    return osp.join(root, f'{family}_{letter}_{"-".join(kinds)}{extra}_{suffix}.pth')


def convert_source(
    family: str,
    src: str,
    load,
    meta: dict,
    *,
    arch='tiny',
    attention: str = 'circulant',
    stage_attentions=None,
    backbone_options: Optional[dict] = None,
    pos_embed_size: Optional[int] = None,
    src_layout: str = 'auto',
    cadeit: bool = False,
    source_blocks: Optional[Sequence[int]] = None,
    base: Optional[str] = None,
):
    """``convert_source`` of the pyramid families (see
    :func:`mmcirc.models.convert.convert_file`): build the target (:func:`build_backbone`
    with ``backbone_options``; ``pos_embed_size``: its ``pretrain_img_size``, source
    position tables resized to it), then ``load(src)`` and convert it
    (:func:`convert_pyramid` with ``src_layout``, or with ``cadeit`` a CA-DeiT source:
    :func:`.deit.convert_cadeit` with ``source_blocks`` and ``load(base)``). Returns
    ``(result, default_out, title)``."""
    if backbone_options is not None and not isinstance(backbone_options, dict):
        raise ConversionError(
            f'backbone_options must be a dict, got {type(backbone_options).__name__}'
        )
    kwargs = dict(backbone_options or {})
    if pos_embed_size is not None:
        if (
            isinstance(pos_embed_size, bool)
            or not isinstance(pos_embed_size, int)
            or pos_embed_size < 1
        ):
            raise ConversionError(
                f'pos_embed_size must be a positive int (px), got {pos_embed_size!r}'
            )
        kwargs['pretrain_img_size'] = pos_embed_size
    model = build_backbone(
        family, arch=arch, attention=attention, stage_attentions=stage_attentions, **kwargs
    )
    ckpt = load(src)
    meta = dict(meta, arch=repr(arch), backbone_options={k: repr(v) for k, v in kwargs.items()})
    if cadeit:
        from .deit import convert_cadeit, width_letter

        base_ckpt = load(base) if base else None
        result = convert_cadeit(ckpt, model, source_blocks=source_blocks, base=base_ckpt, meta=meta)
        width = result.meta['cadeit_width']
        suffix = f'ca-deit-{width_letter(width, "w" + str(width))}'
        title = (
            f'CA-DeiT (width {width}, blocks {result.meta["cadeit_blocks"]}: '
            f'{result.meta["cadeit_loaded"]} tensors) -> {describe(model)}'
        )
    else:
        result = convert_pyramid(
            ckpt,
            model,
            src_layout=src_layout,
            resize_pos_embed=pos_embed_size is not None,
            meta=meta,
        )
        suffix = 'in1k'
        title = f'{family.upper()} ({result.source_layout} layout) -> {describe(model)}'
    return result, default_output_path(model, arch, suffix, options=kwargs), title
