"""CA-DeiT checkpoints (github.com/LeapLabTHU/Circulant-Attention, ``models/ca_deit.py``):
the released file, ``{'model': state_dict}`` in timm's ViT layout without a position
embedding, for two targets (``tools/model_converters/cadeit_to_mmcirc.py``).

* The CA-DeiT itself (:func:`convert_cadeit_official`, ``--family deit``): a whole
  mmpretrain ``ImageClassifier`` checkpoint, ``backbone.*`` (a :class:`CADeiT`, same
  inner keys) and ``head.fc.*`` (the classifier, mmpretrain's ``LinearClsHead``), so
  ``tools/test.py configs/ca_deit_s_in1k.py FILE`` evaluates it and dense configs load
  the backbone with ``init_cfg=dict(type='Pretrained', checkpoint=FILE,
  prefix='backbone.')``. The arch is read from the tensors.
* The circulant blocks of its width (192 / 384 / 768) in a CA/Core pyramid
  (:func:`convert_cadeit`, :data:`CADEIT_BLOCK_KEY_MAP`).

Torch only at import (the pyramid targets need mmdet where they are built).
"""

import math
import os.path as osp
import re
from collections import OrderedDict
from typing import Optional, Sequence

from ..families import register_converter
from .conversion import (
    ARCH_LETTERS,
    OUTPUT_ROOT,
    ConversionError,
    ConversionResult,
    expect_released,
    isotropic_result,
    shape_mismatches,
    strip_common_prefix,
    tensors_of,
    unwrap_state_dict,
)

__all__ = [
    'CADEIT_BLOCK_KEY_MAP',
    'cadeit_arch_of',
    'convert_cadeit',
    'convert_cadeit_official',
    'convert_source',
    'width_letter',
]

#: CA-DeiT block keys (``blocks.{k}.`` + key) -> mmcirc circulant block keys. The FFN
#: target depends on the family: Swin's mmcv FFN (Linear) or PVT's MixFFN (1x1 convs,
#: weights reshaped to (out, in, 1, 1)); the first existing candidate is used.
CADEIT_BLOCK_KEY_MAP = {
    'cpe.weight': ('cpe.weight',),
    'cpe.bias': ('cpe.bias',),
    'norm1.weight': ('norm1.weight',),
    'norm1.bias': ('norm1.bias',),
    'attn.gate.0.weight': ('attn.gate.0.weight',),
    'attn.gate.0.bias': ('attn.gate.0.bias',),
    'attn.qkv.weight': ('attn.qkv.weight',),
    'attn.proj.weight': ('attn.proj.weight',),
    'attn.proj.bias': ('attn.proj.bias',),
    'norm2.weight': ('norm2.weight',),
    'norm2.bias': ('norm2.bias',),
    'mlp.fc1.weight': ('ffn.layers.0.0.weight', 'ffn.layers.0.weight'),
    'mlp.fc1.bias': ('ffn.layers.0.0.bias', 'ffn.layers.0.bias'),
    'mlp.fc2.weight': ('ffn.layers.1.weight', 'ffn.layers.3.weight'),
    'mlp.fc2.bias': ('ffn.layers.1.bias', 'ffn.layers.3.bias'),
}


def _cadeit_class():
    from ..backbones.ca_deit import CADeiT

    return CADeiT


def width_letter(width: int, default: str = '?') -> str:
    """The arch letter of a CA-DeiT width (192: ``'t'``, 384: ``'s'``, 768: ``'b'``)."""
    zoo = _cadeit_class().arch_zoo
    return next(
        (ARCH_LETTERS[n] for n in ARCH_LETTERS if n in zoo and zoo[n]['embed_dims'] == width),
        default,
    )


def _depth(sd) -> int:
    return 1 + max(int(m.group(1)) for m in (re.match(r'^blocks\.(\d+)\.', k) for k in sd) if m)


def cadeit_arch_of(sd) -> dict:
    """Sizes of a CA-DeiT state dict: embed_dims, depth, mlp_ratio, patch_size,
    in_channels, num_classes (None without a head) and the arch name if standard."""
    for key in ('patch_embed.proj.weight', 'blocks.0.norm1.weight', 'blocks.0.mlp.fc1.weight'):
        if key not in sd:
            raise ConversionError(f'not a CA-DeiT checkpoint: no {key}')
    w = sd['patch_embed.proj.weight']
    width = int(w.shape[0])
    depth = _depth(sd)
    ratio = sd['blocks.0.mlp.fc1.weight'].shape[0] / width
    info = dict(
        embed_dims=width,
        depth=depth,
        mlp_ratio=float(ratio),
        patch_size=int(w.shape[-1]),
        in_channels=int(w.shape[1]),
        num_classes=int(sd['head.weight'].shape[0]) if 'head.weight' in sd else None,
    )
    zoo = _cadeit_class().arch_zoo
    found = dict(embed_dims=width, depth=depth, mlp_ratio=ratio)
    info['name'] = (
        next((n for n in ARCH_LETTERS if n in zoo and zoo[n] == found), None)
        if info['patch_size'] == 16
        else None
    )
    return info


def convert_cadeit_official(ckpt, arch=None, meta: Optional[dict] = None):
    """``(result, model)`` for an official CA-DeiT checkpoint (``{'model': sd}`` or a
    bare state dict). ``arch`` (name or dict) must match the checkpoint if given; by
    default it is read from the tensors. ``head.*`` becomes ``head.fc.*``."""
    expect_released(ckpt, 'deit')
    sd = ckpt.get('model', ckpt.get('state_dict', ckpt))
    sd = strip_common_prefix(tensors_of(sd, 'CA-DeiT checkpoint'), 'module.')
    info = cadeit_arch_of(sd)
    CADeiT = _cadeit_class()

    found = dict(embed_dims=info['embed_dims'], depth=info['depth'], mlp_ratio=info['mlp_ratio'])
    if arch is not None:
        try:
            want = CADeiT._parse_arch(arch)
        except ValueError as err:
            raise ConversionError(str(err)) from None
        if {k: float(v) for k, v in want.items()} != {k: float(v) for k, v in found.items()}:
            raise ConversionError(
                f'arch {arch!r} is {want} but the checkpoint has {found}'
                + (f': use arch {info["name"]!r}' if info['name'] else '')
            )
    model = CADeiT(
        arch=info['name'] or found, patch_size=info['patch_size'], in_channels=info['in_channels']
    )
    out, sources, head = OrderedDict(), {}, OrderedDict()
    for k, v in sd.items():
        if k.startswith('head.'):
            head['head.fc.' + k[len('head.') :]] = (v, [k])
        else:
            out[k], sources[k] = v, [k]
    missing = [k for k in model.state_dict() if k not in out]
    if missing:
        raise ConversionError(
            f'the CA-DeiT checkpoint lacks {len(missing)} tensor(s) of the model '
            f'(truncated or foreign?): {missing[:4]}'
        )
    m = dict(
        meta or {},
        family='deit',
        arch=info['name'] or found,
        patch_size=info['patch_size'],
        num_classes=info['num_classes'],
    )
    return isotropic_result(model, out, sources, sd, m, extra=head), model


def convert_source(src, load, meta, *, arch=None):
    """The released CA-DeiT file ``src`` for :class:`CADeiT` + ``LinearClsHead``
    (see :func:`mmcirc.models.convert.convert_file`)."""
    result, model = convert_cadeit_official(load(src), arch=arch, meta=meta)
    name = result.meta['arch']
    variant = f'ca_deit_{ARCH_LETTERS[name]}' if isinstance(name, str) else 'ca_deit_custom'
    title = (
        f'CA-DeiT ({name}, {model.embed_dims} wide, {model.depth} blocks) -> CADeiT + LinearClsHead'
    )
    return result, osp.join(OUTPUT_ROOT, f'{variant}_official.pth'), title


def convert_cadeit(
    ckpt,
    model,
    source_blocks: Optional[Sequence[int]] = None,
    base=None,
    meta: Optional[dict] = None,
) -> ConversionResult:
    """Load CA-DeiT blocks into the circulant blocks of ``model`` that have its width.

    Target circulant blocks of width C (the CA-DeiT width) are taken in order (stage
    by stage, block by block) and paired with CA-DeiT blocks ``source_blocks``
    (default 0, 1, 2, ...); each tensor of :data:`CADEIT_BLOCK_KEY_MAP` whose shape
    fits is copied (the MLP is skipped, and reported unused, where the MLP ratio
    differs, e.g. PVT's 8). ``base`` (a checkpoint in mmcirc's layout, e.g. the output
    of :func:`.pyramid.convert_pyramid`) supplies everything else; CA-DeiT tensors
    replace its entries. Raises :class:`ConversionError` if nothing fits.
    """
    from ..blocks import CirculantBlock
    from .pyramid_target import describe, pyramid_result

    sd, outside = unwrap_state_dict(ckpt)
    needed = ('blocks.0.attn.qkv.weight', 'blocks.0.attn.gate.0.weight', 'blocks.0.norm1.weight')
    probe = [k for k in needed if k not in sd]
    if probe:
        raise ConversionError(
            f'not a CA-DeiT checkpoint: no {", ".join(probe)} (a plain DeiT has no '
            'gate and no CPE and cannot initialise circulant attention)'
        )
    width = int(sd['blocks.0.norm1.weight'].shape[0])
    depth = _depth(sd)
    target = model.state_dict()
    attr = model.stages_attr
    circulant = [
        i for i, stage in enumerate(model.stages) if stage.attention == CirculantBlock.kind
    ]
    slots = [
        (i, j) for i in circulant for j in range(model.depths[i]) if model.embed_dims[i] == width
    ]
    if not slots:
        circ = {i: model.embed_dims[i] for i in circulant}
        raise ConversionError(
            f'no circulant block of width {width} (CA-DeiT-{width_letter(width).upper()}) in '
            f'{describe(model)}: its circulant stages have widths {circ}; CA-DeiT blocks only fit a '
            'circulant stage of their width (choose stage_attentions accordingly)'
        )
    source_blocks = list(range(depth)) if source_blocks is None else [int(b) for b in source_blocks]
    bad = [b for b in source_blocks if not 0 <= b < depth]
    if bad:
        raise ConversionError(
            f'source blocks {bad} out of range: the CA-DeiT checkpoint has {depth} blocks'
        )

    out, loaded_from = OrderedDict(), {}
    if base is not None:
        base_sd, _ = unwrap_state_dict(base)
        bad = shape_mismatches(base_sd, target, 'base')
        if bad:
            raise ConversionError(
                f'the base checkpoint does not fit {describe(model)}:\n'
                + '\n'.join(f'  {b}' for b in bad[:6])
            )
        for k, v in base_sd.items():
            if k in target:
                out[k] = v
                loaded_from[k] = [f'(base) {k}']
    for (i, j), b in zip(slots, source_blocks):
        block = f'{attr}.{i}.blocks.{j}.'
        for src_key, candidates in CADEIT_BLOCK_KEY_MAP.items():
            src = f'blocks.{b}.{src_key}'
            dst = next((block + c for c in candidates if block + c in target), None)
            if src not in sd or dst is None:
                continue
            value, want = sd[src], target[dst].shape
            # Linear -> 1x1 conv (PVT MixFFN)
            if len(want) == 4 and tuple(want[2:]) == (1, 1) and value.numel() == math.prod(want):
                value = value.reshape(want)
            if value.shape == want:
                out[dst] = value
                loaded_from[dst] = [src]
    meta = dict(
        meta or {},
        cadeit_width=width,
        cadeit_blocks=[b for _, b in zip(slots, source_blocks)],
        cadeit_loaded=sum(not s[0].startswith('(base)') for s in loaded_from.values()),
        base=base is not None,
    )
    return pyramid_result(model, out, loaded_from, list(sd) + outside, 'ca-deit', meta=meta)


register_converter('deit', convert_source)
