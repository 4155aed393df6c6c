"""Checkpoint converters: official / OpenMMLab PVT, Swin and CA-DeiT weights to the
CA/Core pyramids of mmcirc (``tools/model_converters/*_to_mmcirc.py``).

The circulant (or core) stages of CA-PVT / CA-Swin keep everything of PVT / Swin
except the attention (METHOD.md, "CA in pyramids"), so an ImageNet checkpoint of the
original pyramid initialises all of it: patch embeddings, position embeddings, norms,
the MLPs of every stage (same shapes in circulant/core stages) and the attention of
the stages that keep it (PVT spatial-reduction attention, Swin shifted windows). What
is left new (initialised by the model) is the replaced attention: circulant
``attn.{gate.0,qkv,proj}``, core ``attn.*``, the CPE ``cpe`` and the core banks
``cores``. What the source has and the target cannot use (stage 1-2 SRA / window
attention, classifier head, ...) is reported as unused.

Key mappings are not rewritten here; the OpenMMLab ones are reused:

* PVT v1 (whai362 release: ``patch_embed1.proj``, ``pos_embed1``, ``block1.0.attn.q``
  / ``.kv`` / ``.sr``, ``norm``, ``cls_token``, ``head``) -> mmdet's
  ``PyramidVisionTransformer`` layout with mmdet's ``pvt_convert``, then -> ours with
  :func:`mmcirc.models.backbones.ca_pvt.convert_mmdet_pvt_keys`.
* Swin (microsoft release: ``patch_embed.proj``, ``layers.{i}.blocks.{j}.attn.qkv``,
  ``layers.{i}.downsample.reduction``, ``norm``, ``head``) -> mmdet's
  ``SwinTransformer`` layout (equal to ours) with mmdet's ``swin_converter``
  (which also reorders the patch-merging weights for mmcv's unfold). One addition,
  the convention of mmpretrain's Swin checkpoints: the official final LN ``norm`` (on
  the last stage's output) becomes ``norm{last}``; mmdet drops it.
* mmdet / mmseg / mmpretrain Swin and mmdet PVT checkpoints (e.g. a whole detector,
  ``backbone.`` prefixed) and mmcirc checkpoints need no conversion or only
  ``convert_mmdet_pvt_keys``.
* CA-DeiT (github.com/LeapLabTHU/Circulant-Attention, ``models/ca_deit.py``, timm
  ViT layout, no position embedding): ``blocks.{k}.{cpe, norm1, attn.qkv (no bias),
  attn.gate.0, attn.proj, norm2, mlp.fc1, mlp.fc2}`` (:data:`CADEIT_BLOCK_KEY_MAP`).
  CA-DeiT is isotropic (width 192 / 384 / 768), so its blocks only fit the target's
  circulant blocks of that width; they are assigned in order (stage by stage, block
  by block), tensor by tensor when the shapes match.

Every converted tensor is checked against the target model, built through mmcirc's
registered class: a shape or depth mismatch (e.g. a PVT-S checkpoint for
``arch='tiny'``) raises :class:`ConversionError` naming the tensor, both shapes and the archs
that would fit. The output is ``{'state_dict': {backbone keys, no prefix}, 'meta':
{...}}``, written atomically (:mod:`mmcirc.utils.fileio`), which the configs load
with ``init_cfg=dict(type='Pretrained', checkpoint=...)``. :func:`convert_file` does
it all from file to file (what ``tools/model_converters`` run).

Provenance (which source tensors a converted tensor came from, hence what was
unused) is traced by running the reused converter once on index-valued stand-ins of
the source tensors, so nothing about the OpenMMLab mappings is assumed here.
"""

import math
import os.path as osp
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

__all__ = [
    'ConversionError',
    'ConversionResult',
    'LAYOUTS',
    'CADEIT_BLOCK_KEY_MAP',
    'load_source',
    'unwrap_state_dict',
    'detect_layout',
    'to_mmcirc_keys',
    'family_of',
    'build_backbone',
    'replaced_attention_keys',
    'convert_pyramid',
    'convert_cadeit',
    'default_output_path',
    'save_checkpoint',
    'format_summary',
    'convert_file',
]

#: Source layouts each family accepts (``'auto'`` detects one of them). For Swin the
#: mmdet, mmseg, mmpretrain and mmcirc layouts are one and the same key space.
LAYOUTS = {
    'pvt': ('official', 'mmdet', 'mmcirc'),
    'swin': ('official', 'mmdet', 'mmseg', 'mmpretrain', 'mmcirc'),
}

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

_ARCH_LETTERS = {'tiny': 't', 'small': 's', 'medium': 'm', 'large': 'l', 'base': 'b'}
_CADEIT_WIDTHS = {192: 't', 384: 's', 768: 'b'}


class ConversionError(ValueError):
    """The checkpoint does not fit the requested conversion (one readable message)."""


# --------------------------------------------------------------------------- source
def load_source(path: str, trust: bool = False):
    """Load a checkpoint file with mmcirc's safe loader (tensors, containers and the
    types mmengine writes; ``trust=True`` allows full unpickling of this one file)."""
    from mmcirc.engine import load_from_local_safely, trust_checkpoint

    if not osp.isfile(osp.expanduser(path)):
        raise FileNotFoundError(f'checkpoint not found: {path}')
    if trust:
        trust_checkpoint(path)
    try:
        return load_from_local_safely(path, map_location='cpu')
    except (RuntimeError, EOFError) as err:  # not a torch checkpoint, truncated file
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConversionError(f'cannot read {path}: {reason}') from None


def unwrap_state_dict(ckpt) -> tuple:
    """``(state_dict, outside)``: the tensors of a checkpoint, unwrapped from
    ``'state_dict'`` / ``'model'`` / ``'module'``, without a ``module.`` (DDP) prefix
    and, if any key has it, reduced to the ``backbone.`` entries with the prefix
    removed. ``outside`` lists the keys left out (e.g. ``neck.*``, ``head.*``) and any
    non-tensor entries."""
    if not isinstance(ckpt, dict):
        raise ConversionError(f'expected a checkpoint dict, got {type(ckpt).__name__}')
    for wrapper in ('state_dict', 'model', 'module'):
        if isinstance(ckpt.get(wrapper), dict):
            ckpt = ckpt[wrapper]
            break
    if not ckpt:
        raise ConversionError('the checkpoint holds no tensors')
    outside = [k for k, v in ckpt.items() if not torch.is_tensor(v)]
    sd = OrderedDict((k, v) for k, v in ckpt.items() if torch.is_tensor(v))
    if not sd:
        raise ConversionError(
            f'no tensors found in the checkpoint (top-level keys: {list(ckpt)[:8]})'
        )
    if all(k.startswith('module.') for k in sd):
        sd = OrderedDict((k[len('module.') :], v) for k, v in sd.items())
    if any(k.startswith('backbone.') for k in sd):
        outside += [k for k in sd if not k.startswith('backbone.')]
        sd = OrderedDict(
            (k[len('backbone.') :], v) for k, v in sd.items() if k.startswith('backbone.')
        )
    return sd, outside


#: Keys that only one layout of a family has (first match wins).
_LAYOUT_PATTERNS = {
    'pvt': (
        ('official', r'^(patch_embed\d+\.proj\.|block\d+\.\d+\.(attn|mlp)\.|pos_embed\d+$)'),
        ('mmcirc', r'^layers\.\d+\.patch_embed\.projection\.'),
        ('mmdet', r'^layers\.\d+\.0\.projection\.'),
    ),
    'swin': (
        ('official', r'^(layers\.\d+\.blocks\.\d+\.mlp\.fc1\.|patch_embed\.proj\.)'),
        ('mmdet', r'^(stages\.\d+\.blocks\.|patch_embed\.projection\.)'),
    ),
}


def detect_layout(family: str, state_dict) -> str:
    """The source layout of a (backbone) state dict: ``'official'``, ``'mmdet'`` or
    (PVT) ``'mmcirc'``; for Swin, mmseg / mmpretrain / mmcirc read as ``'mmdet'``."""
    for layout, pattern in _LAYOUT_PATTERNS[family]:
        if any(re.match(pattern, k) for k in state_dict):
            return layout
    raise ConversionError(
        f'cannot recognise the {family.upper()} checkpoint layout from its keys '
        f'{list(state_dict)[:6]}...; is it a {family.upper()} checkpoint? (or give src_layout)'
    )


def _swin_official_to_mmdet(sd):
    """mmdet's ``swin_converter``, then the official final LN ``norm`` -> ``norm{last}``
    (mmpretrain's convention)."""
    from mmdet.models.backbones.swin import swin_converter

    out = OrderedDict((k[len('backbone.') :], v) for k, v in swin_converter(sd).items())
    stages = [int(m.group(1)) for m in (re.match(r'^stages\.(\d+)\.', k) for k in out) if m]
    if stages:
        last = max(stages)
        out = OrderedDict((re.sub(r'^norm\.', f'norm{last}.', k), v) for k, v in out.items())
    return out


def _pvt_mmdet_to_mmcirc(sd):
    from .backbones.ca_pvt import convert_mmdet_pvt_keys

    has_pos = any(re.match(r'^layers\.\d+\.1\.0\.pos_embed$', k) for k in sd)
    return OrderedDict(convert_mmdet_pvt_keys(sd, use_abs_pos_embed=has_pos))


def _pvt_official_to_mmcirc(sd):
    from mmdet.models.backbones.pvt import pvt_convert

    return _pvt_mmdet_to_mmcirc(pvt_convert(sd))


def _converter(family: str, layout: str):
    if layout not in LAYOUTS[family]:
        extra = ' (mmpretrain and mmseg have no PVT v1)' if family == 'pvt' else ''
        raise ConversionError(
            f'src_layout for {family.upper()} must be one of '
            f'{("auto",) + LAYOUTS[family]}{extra}, got {layout!r}'
        )
    if family == 'pvt':
        return {'official': _pvt_official_to_mmcirc, 'mmdet': _pvt_mmdet_to_mmcirc}.get(
            layout, OrderedDict
        )
    return _swin_official_to_mmdet if layout == 'official' else OrderedDict


def _trace(convert, sd) -> Dict[str, List[str]]:
    """Run ``convert`` on stand-ins of the source tensors (each filled, without
    allocating, with its own index) and read which source tensors every output was
    made from: {output key: [source keys]}."""
    names = list(sd)
    tags = OrderedDict(
        (k, torch.tensor(i, dtype=torch.int64).expand(v.shape))
        for i, (k, v) in enumerate(sd.items())
    )
    prov = {}
    for key, t in convert(tags).items():
        if t.numel() == 0:
            ids = []
        elif all(s == 0 for s in t.stride()):
            ids = [int(t[(0,) * t.dim()])]
        else:
            ids = torch.unique(t).tolist()
        prov[key] = [names[i] for i in ids]
    return prov


def to_mmcirc_keys(family: str, state_dict, layout: str = 'auto') -> tuple:
    """``(mapped, provenance, layout)``: the source state dict in mmcirc's key space
    (values produced by the reused OpenMMLab converters), for every mapped key the
    source keys it came from, and the layout used."""
    if layout == 'auto':
        layout = detect_layout(family, state_dict)
    convert = _converter(family, layout)
    mapped = OrderedDict(convert(state_dict))
    provenance = _trace(convert, state_dict)
    if set(provenance) != set(mapped):  # pragma: no cover - converters are key-deterministic
        raise ConversionError('internal error: the converter is not deterministic in its keys')
    return mapped, provenance, layout


# --------------------------------------------------------------------------- target
def family_of(model) -> str:
    """The family (``'pvt'``, ``'swin'``) of a built CA/Core pyramid."""
    from .backbones.pyramid import PyramidBackbone

    if isinstance(model, PyramidBackbone) and model.family in LAYOUTS:
        return model.family
    raise ConversionError(
        f'not an mmcirc pyramid with a converter ({tuple(LAYOUTS)}): {type(model).__name__}'
    )


def build_backbone(
    family: str,
    arch='tiny',
    attention: str = 'circulant',
    stage_attentions: Optional[Sequence[str]] = None,
    **kwargs,
):
    """Build the target through mmcirc's registered classes (mmdet's MODELS): the
    family's registered pyramid whose default attention is the one replaced kind
    (``CorePVT`` / ``CoreSwin`` when the replaced stages are all core), else the
    family's base class (``CAPVT`` / ``CASwin``)."""
    import mmcirc  # noqa: F401  (registration)
    from mmcirc.registry import model_registries
    from .backbones.pyramid import registered_pyramids

    families = {f: c for f, c in registered_pyramids().items() if f in LAYOUTS}
    if family not in families:
        raise ConversionError(f'family must be one of {tuple(families)}, got {family!r}')
    classes = families[family]
    kinds = (
        [attention]
        if stage_attentions is None
        else list([stage_attentions] if isinstance(stage_attentions, str) else stage_attentions)
    )
    replaced = {k for k in kinds if k != classes[0].original_attention}
    cls = next((c for c in classes if replaced == {c.default_attention}), classes[0])
    cfg = dict(type=cls.__name__, arch=arch, attention=attention, **kwargs)
    if stage_attentions is not None:
        cfg['stage_attentions'] = stage_attentions
    try:
        model = model_registries()[0].build(cfg)
    except (ValueError, TypeError) as err:
        raise ConversionError(f'cannot build the target {cfg["type"]}: {err}') from None
    return model


def replaced_attention_keys(model) -> List[str]:
    """State-dict keys of the replaced attention, as the blocks declare them
    (``added_keys``: e.g. circulant / core ``blocks.{j}.attn.*``, ``blocks.{j}.cpe.*``),
    and the core banks ``cores`` of the stages that carry cores."""
    from .blocks import PyramidBlock

    attr = model.stages_attr
    keys = []
    for i, stage in enumerate(model.stages):
        if stage.cores is not None:
            keys.append(f'{attr}.{i}.cores')
        for j, block in enumerate(stage.blocks):
            if isinstance(block, PyramidBlock):
                keys += [f'{attr}.{i}.blocks.{j}.{k}' for k in block.added_state_keys()]
    return keys


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


def _describe(model) -> str:
    return (
        f'{type(model).__name__}(embed_dims={model.embed_dims}, depths={model.depths}, '
        f'stage_attentions={model.stage_attentions})'
    )


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


# --------------------------------------------------------------------------- result
@dataclass
class ConversionResult:
    """A converted checkpoint and what happened to every tensor.

    Attributes:
        state_dict: target keys -> tensors (model order); everything but ``new``.
        source_layout: layout the source was read in.
        loaded: target keys filled from the source.
        sources: for each loaded key, the source keys it was made from.
        new_attention: target parameters of the replaced attention not in the source
            (circulant/core attention, CPE, core banks: left to the model's init).
        new_other: other target parameters the source lacks (e.g. Swin ``norm0-2``:
            the official classifier has only the last output norm).
        from_model: target buffers the source lacks, copied from the built model
            (constants such as Swin's ``relative_position_index``).
        unused: source keys that went nowhere (e.g. stage 1-2 SRA, ``head``).
        resized: target keys whose tables were resized (``pos_embed_size``).
        meta: what goes under ``'meta'`` in the saved file.
    """

    state_dict: 'OrderedDict[str, torch.Tensor]'
    source_layout: str
    loaded: List[str] = field(default_factory=list)
    sources: Dict[str, List[str]] = field(default_factory=dict)
    new_attention: List[str] = field(default_factory=list)
    new_other: List[str] = field(default_factory=list)
    from_model: List[str] = field(default_factory=list)
    unused: List[str] = field(default_factory=list)
    resized: List[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    sizes: Dict[str, int] = field(default_factory=dict)  # values per target key

    @property
    def new(self) -> List[str]:
        return self.new_attention + self.new_other


def _finish(
    model,
    out: 'OrderedDict',
    loaded_from: Dict[str, List[str]],
    all_source: Sequence[str],
    layout: str,
    resized=(),
    meta=None,
) -> ConversionResult:
    """Fill buffers from the model, classify what is new and unused, order like the model."""
    target = model.state_dict()
    params = {k for k, _ in model.named_parameters()}
    attention = set(replaced_attention_keys(model))
    result = ConversionResult(
        state_dict=OrderedDict(),
        source_layout=layout,
        resized=list(resized),
        sizes={k: v.numel() for k, v in target.items()},
    )
    for key, value in target.items():
        if key in out:
            result.state_dict[key] = out[key]
            if key in loaded_from:
                result.loaded.append(key)
                result.sources[key] = list(loaded_from[key])
        elif key not in params:
            result.state_dict[key] = value.detach().clone()
            result.from_model.append(key)
        elif key in attention:
            result.new_attention.append(key)
        else:
            result.new_other.append(key)
    used = {s for key in result.loaded for s in result.sources[key]}
    result.unused = [k for k in all_source if k not in used]
    result.meta = dict(
        converter='mmcirc.models.convert',
        source_layout=layout,
        model=dict(
            type=type(model).__name__,
            embed_dims=list(model.embed_dims),
            depths=list(model.depths),
            stage_attentions=list(model.stage_attentions),
        ),
        loaded=len(result.loaded),
        new=list(result.new),
        unused=list(result.unused),
        resized=list(result.resized),
        **(meta or {}),
    )
    return result


def _contiguous_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone(memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------- pyramids
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
        src_layout (str): ``'auto'`` or one of :data:`LAYOUTS` of the family.
        resize_pos_embed (bool): PVT only: resize position tables of another image
            size (square grids, bilinear, mmdet's ``AbsolutePositionEmbedding``) to
            the model's; otherwise a size mismatch is an error.
        meta (dict, optional): extra entries for ``result.meta``.

    Every target key found in the mapped source must have the same shape, and the
    source's blocks per stage must equal the model's depths; else
    :class:`ConversionError`.
    """
    family = family_of(model)
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
            f'depth mismatch: {_arch_hint(model, depths, widths)}; the target is {_describe(model)}'
        )

    out, loaded_from, mismatches, resized = OrderedDict(), {}, [], []
    for key, value in mapped.items():
        if key not in target:
            continue
        want = target[key].shape
        if value.shape != want:
            if (
                resize_pos_embed
                and re.match(rf'^{attr}\.\d+\.pos_embed\.pos_embed$', key)
                and value.dim() == 3
                and value.shape[2] == want[2]
            ):
                value = _resize_pos_embed(key, value, model)
                resized.append(key)
            else:
                mismatches.append(
                    f'  {key}: checkpoint {tuple(value.shape)} vs model {tuple(want)}'
                )
                continue
        out[key] = _contiguous_copy(value)
        loaded_from[key] = provenance[key]
    if not out and not mismatches:
        raise ConversionError(
            f'nothing in the checkpoint ({src_layout} layout read as {layout}) fits '
            f'{_describe(model)}; keys: {list(sd)[:6]}...'
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
            f'{_describe(model)}:\n{shown}\n{hint}'
        )
    return _finish(model, out, loaded_from, list(sd) + outside, layout, resized, meta)


def _resize_pos_embed(key: str, value: torch.Tensor, model) -> torch.Tensor:
    from mmdet.models.backbones.pvt import AbsolutePositionEmbedding

    stage = model.stages[int(key.split('.')[1])]
    side = math.isqrt(value.shape[1])
    if side * side != value.shape[1]:
        raise ConversionError(
            f'{key}: cannot resize a position table of {value.shape[1]} tokens (not a square grid)'
        )
    src = AbsolutePositionEmbedding(pos_shape=(side, side), pos_dim=value.shape[2])
    return src.resize_pos_embed(value.float(), tuple(stage.pos_embed.pos_shape)).to(value.dtype)


# --------------------------------------------------------------------------- CA-DeiT
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
    of :func:`convert_pyramid`) supplies everything else; CA-DeiT tensors replace its
    entries. Raises :class:`ConversionError` if nothing fits.
    """
    sd, outside = unwrap_state_dict(ckpt)
    probe = [
        k
        for k in (
            'blocks.0.attn.qkv.weight',
            'blocks.0.attn.gate.0.weight',
            'blocks.0.norm1.weight',
        )
        if k not in sd
    ]
    if probe:
        raise ConversionError(
            f'not a CA-DeiT checkpoint: no {", ".join(probe)} (a plain DeiT has no '
            'gate and no CPE and cannot initialise circulant attention)'
        )
    width = int(sd['blocks.0.norm1.weight'].shape[0])
    depth = 1 + max(int(m.group(1)) for m in (re.match(r'^blocks\.(\d+)\.', k) for k in sd) if m)
    target = model.state_dict()
    attr = model.stages_attr
    from .blocks import CirculantBlock

    circulant = [
        i for i, stage in enumerate(model.stages) if stage.attention == CirculantBlock.kind
    ]
    slots = [
        (i, j) for i in circulant for j in range(model.depths[i]) if model.embed_dims[i] == width
    ]
    if not slots:
        circ = {i: model.embed_dims[i] for i in circulant}
        raise ConversionError(
            f'no circulant block of width {width} (CA-DeiT-{_CADEIT_WIDTHS.get(width, "?").upper()}) in '
            f'{_describe(model)}: its circulant stages have widths {circ}; CA-DeiT blocks only fit a '
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
        bad = [
            f'  {k}: base {tuple(v.shape)} vs model {tuple(target[k].shape)}'
            for k, v in base_sd.items()
            if k in target and v.shape != target[k].shape
        ]
        if bad:
            raise ConversionError(
                f'the base checkpoint does not fit {_describe(model)}:\n' + '\n'.join(bad[:6])
            )
        for k, v in base_sd.items():
            if k in target:
                out[k] = _contiguous_copy(v)
                loaded_from[k] = [f'(base) {k}']
    for (i, j), b in zip(slots, source_blocks):
        for src_key, candidates in CADEIT_BLOCK_KEY_MAP.items():
            src = f'blocks.{b}.{src_key}'
            dst = next(
                (
                    f'{attr}.{i}.blocks.{j}.{c}'
                    for c in candidates
                    if f'{attr}.{i}.blocks.{j}.{c}' in target
                ),
                None,
            )
            if src not in sd or dst is None:
                continue
            value, want = sd[src], target[dst].shape
            if (
                value.shape != want
                and value.numel() == math.prod(want)
                and len(want) == 4
                and tuple(want[2:]) == (1, 1)
            ):  # Linear -> 1x1 conv (PVT MixFFN)
                value = value.reshape(want)
            if value.shape == want:
                out[dst] = _contiguous_copy(value)
                loaded_from[dst] = [src]
    meta = dict(
        meta or {},
        cadeit_width=width,
        cadeit_blocks=[b for _, b in zip(slots, source_blocks)],
        cadeit_loaded=sum(not s[0].startswith('(base)') for s in loaded_from.values()),
        base=base is not None,
    )
    return _finish(model, out, loaded_from, list(sd) + outside, 'ca-deit', meta=meta)


# --------------------------------------------------------------------------- output
def default_output_path(
    model, arch, suffix: str = 'in1k', root: str = 'work_dirs/pretrained'
) -> str:
    """``{root}/{variant}_{suffix}.pth`` with the config names' variant, e.g.
    ``ca_pvt_s``, ``core_swin_t``; a non-default stage layout is spelled out
    (``pvt_s_circulant-circulant-circulant-sra``)."""
    family = family_of(model)
    letter = _ARCH_LETTERS.get(arch, 'custom') if isinstance(arch, str) else 'custom'
    kinds = tuple(model.stage_attentions)
    k = model.num_replaced_stages
    for attention, prefix in (('circulant', 'ca'), ('core', 'core')):
        if kinds == (attention,) * k + (model.original_attention,) * (len(kinds) - k):
            return osp.join(root, f'{prefix}_{family}_{letter}_{suffix}.pth')
    return osp.join(root, f'{family}_{letter}_{"-".join(kinds)}_{suffix}.pth')


def save_checkpoint(result: ConversionResult, path: str) -> str:
    """Write ``{'state_dict': ..., 'meta': ...}`` to ``path`` atomically
    (:func:`mmcirc.utils.fileio.atomic_open`); returns ``path``."""
    from mmcirc.utils.fileio import atomic_open

    path = osp.expanduser(path)
    with atomic_open(path, 'wb') as f:
        torch.save({'state_dict': result.state_dict, 'meta': result.meta}, f)
    return path


def _group(keys: Sequence[str]) -> List[str]:
    """Compact key list: stage and block indices become ``*``, with counts."""
    counts = OrderedDict()
    for k in keys:
        g = re.sub(r'^(layers|stages)\.\d+\.', r'\1.*.', k)
        g = re.sub(r'\.blocks\.\d+\.', '.blocks.*.', g)
        g = re.sub(
            r'^(block|blocks\.)\d+\.(\d+\.)?',
            lambda m: m.group(1) + '*.' + ('*.' if m.group(2) else ''),
            g,
        )
        g = re.sub(r'^(patch_embed|pos_embed)\d+', r'\1*', g)
        counts[g] = counts.get(g, 0) + 1
    return [f'{g} (x{n})' if n > 1 else g for g, n in counts.items()]


def format_summary(
    result: ConversionResult,
    title: str,
    verbose: bool = False,
    more_hint: str = 'verbose=True lists all',
) -> str:
    """Human-readable report of a conversion (``verbose``: every key; otherwise long
    lists are cut, with ``more_hint`` saying how to see them whole)."""

    def block(name, keys):
        n = sum(result.sizes.get(k, 0) for k in keys)
        head = f'{name}: {len(keys)} tensors' + (f' ({n:,} values)' if n else '')
        items = list(keys) if verbose else _group(keys)
        if not verbose and len(items) > 16:
            items = items[:16] + [f'... {len(items) - 16} more ({more_hint})']
        return '\n'.join([head] + [f'    {s}' for s in items])

    lines = [title, block('loaded', result.loaded)]
    if result.resized:
        lines.append(block('resized (position tables)', result.resized))
    if result.from_model:
        lines.append(block('buffers taken from the model', result.from_model))
    lines.append(block('new: replaced attention, left to the model init', result.new_attention))
    if result.new_other:
        lines.append(block('new: other, not in the source', result.new_other))
    lines.append(block('unused from the source', result.unused))
    return '\n'.join(lines)


# --------------------------------------------------------------------------- file to file
def convert_file(
    family: str,
    src: str,
    out: Optional[str] = None,
    *,
    arch='tiny',
    attention: str = 'circulant',
    stage_attentions=None,
    backbone_options: Optional[dict] = None,
    pos_embed_size: Optional[int] = None,
    src_layout: str = 'auto',
    trust: bool = False,
    cadeit: bool = False,
    source_blocks: Optional[Sequence[int]] = None,
    base: Optional[str] = None,
):
    """Convert the checkpoint file ``src`` for a ``family`` pyramid and save it.

    The target is :func:`build_backbone` ``(family, arch, attention, stage_attentions,
    **backbone_options)`` (``pos_embed_size``: its ``pretrain_img_size``, source position
    tables resized to it). ``src`` is a PVT / Swin checkpoint (:func:`convert_pyramid`,
    ``src_layout``) or, with ``cadeit``, a CA-DeiT one (:func:`convert_cadeit` with
    ``source_blocks`` and the mmcirc checkpoint ``base``). ``trust`` allows full
    unpickling (:func:`load_source`). Saved atomically to ``out`` (default
    :func:`default_output_path`).

    Returns ``(result, out, title)``: the :class:`ConversionResult`, the path written and
    a one-line description for :func:`format_summary`. Raises :class:`ConversionError`
    (a ``ValueError``) naming the parameter or tensor that does not fit.
    """
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
    ckpt = load_source(src, trust=trust)
    meta = dict(
        source=osp.basename(src),
        arch=repr(arch),
        backbone_options={k: repr(v) for k, v in kwargs.items()},
    )
    if cadeit:
        base_ckpt = load_source(base, trust=trust) if base else None
        result = convert_cadeit(ckpt, model, source_blocks=source_blocks, base=base_ckpt, meta=meta)
        width = result.meta['cadeit_width']
        suffix = f'ca-deit-{_CADEIT_WIDTHS.get(width, "w" + str(width))}'
        title = (
            f'CA-DeiT (width {width}, blocks {result.meta["cadeit_blocks"]}: '
            f'{result.meta["cadeit_loaded"]} tensors) -> {_describe(model)}'
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
        title = f'{family.upper()} ({result.source_layout} layout) -> {_describe(model)}'
    out = out or default_output_path(model, arch, suffix)
    save_checkpoint(result, out)
    return result, out, title
