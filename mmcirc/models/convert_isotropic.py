"""Converters for the released isotropic models: the official CA-DeiT and VECA
checkpoint files, as downloaded, to mmcirc checkpoints (METHOD.md 3).

* CA-DeiT (github.com/LeapLabTHU/Circulant-Attention): ``{'model': state_dict}`` in
  timm's ViT layout (``patch_embed.proj``, ``blocks.{k}.*``, ``norm``, ``head``). The
  output is a whole mmpretrain ``ImageClassifier`` checkpoint: ``backbone.*`` (a
  :class:`~mmcirc.models.backbones.CADeiT`, same inner keys) and ``head.fc.*`` (the
  classifier, mmpretrain's ``LinearClsHead``), so ``tools/test.py
  configs/ca_deit_s_in1k.py FILE`` evaluates it and dense configs load the backbone
  with ``init_cfg=dict(type='Pretrained', checkpoint=FILE, prefix='backbone.')``.
* VECA (github.com/alansong1322/VECA): ``{'student': state_dict, 'config': {...},
  ...}`` (keys possibly ``module.`` / ``student.`` prefixed; optimizer states and the
  rest are ignored). The arch comes from ``config['model_family']`` (the official
  loader's rule: the family preset decides the sizes, 'base' when absent); the core
  bank chunks ``query_token_chunks.{i}`` / ``qcoord_chunks.{i}`` become ``cores`` /
  ``core_coords``; everything else keeps its name under ``backbone.``. The config's
  settings that change the model (patch size, patch LN, RoPE, output projection,
  chunk) are checked against the tensors and written to ``meta['backbone']`` (the
  arguments a config must give :class:`~mmcirc.models.backbones.VECAViT`).

Both load through mmcirc's safe loader (:func:`mmcirc.models.convert.load_source`),
check every tensor against the built model (shape, and nothing missing, nothing left
over), and write atomically (:func:`mmcirc.models.convert.save_checkpoint`);
:func:`convert_isotropic_file` does it from file to file.
"""

import os.path as osp
import re
from collections import OrderedDict
from typing import Optional

import torch

from .convert import ConversionError, ConversionResult, load_source, save_checkpoint

__all__ = [
    'convert_cadeit_official',
    'convert_veca_official',
    'cadeit_arch_of',
    'veca_settings_of',
    'format_isotropic_summary',
    'convert_isotropic_file',
    'CheckpointKindError',
    'CADEIT_LETTERS',
    'VECA_FAMILIES',
]

CADEIT_LETTERS = {'tiny': 't', 'small': 's', 'base': 'b'}
VECA_FAMILIES = ('small', 'splus', 'base', 'large')


#: kind -> (name, what its file holds, in short and in full)
_KINDS = {
    'cadeit': (
        'CA-DeiT',
        '{"model": ...} with circulant attention',
        '{"model": state dict} with blocks.*.attn.gate.0.weight (circulant attention)',
    ),
    'veca': ('VECA', '{"student": ..., "config": ...}', '{"student": state dict, "config": {...}}'),
}


class CheckpointKindError(ConversionError):
    """The checkpoint is the other released kind (``found``: ``'cadeit'`` or ``'veca'``)."""

    def __init__(self, message: str, found: str):
        super().__init__(message)
        self.found = found


# --------------------------------------------------------------------------- helpers
def _kind(ckpt) -> str:
    """'veca', 'cadeit' or 'other' from the top level of a loaded checkpoint."""
    if isinstance(ckpt, dict) and isinstance(ckpt.get('student'), dict):
        return 'veca'
    if isinstance(ckpt, dict):
        sd = ckpt.get('model', ckpt.get('state_dict', ckpt))
        if isinstance(sd, dict) and any(
            re.match(r'^(module\.)?blocks\.\d+\.attn\.gate\.0\.weight$', str(k)) for k in sd
        ):
            return 'cadeit'
    return 'other'


def _expect_kind(ckpt, want: str) -> None:
    """Raise unless ``ckpt`` is a released checkpoint of kind ``want``: a
    :class:`CheckpointKindError` for the other released kind, else a
    :class:`ConversionError` saying what was expected."""
    kind, name = _kind(ckpt), _KINDS[want][0]
    if kind == want:
        return
    if kind in _KINDS:
        raise CheckpointKindError(
            f'this is a {_KINDS[kind][0]} checkpoint ({_KINDS[kind][1]}), not {name}', found=kind
        )
    keys = list(ckpt)[:6] if isinstance(ckpt, dict) else type(ckpt).__name__
    raise ConversionError(f'not a {name} checkpoint: expected {_KINDS[want][2]}, got {keys}')


def _tensors(sd, what: str) -> 'OrderedDict[str, torch.Tensor]':
    if not isinstance(sd, dict):
        raise ConversionError(f'{what}: expected a dict of tensors, got {type(sd).__name__}')
    out = OrderedDict((k, v) for k, v in sd.items() if torch.is_tensor(v))
    if not out:
        raise ConversionError(f'{what}: no tensors found (keys: {list(sd)[:6]})')
    return out


def _result(
    model,
    out: 'OrderedDict',
    sources: dict,
    extra_out: 'OrderedDict',
    source_keys,
    meta,
    prefix='backbone.',
) -> ConversionResult:
    """Check ``out`` (model keys) against ``model``: same shapes, nothing missing."""
    target = model.state_dict()
    bad = [
        f'  {k}: checkpoint {tuple(v.shape)} vs model {tuple(target[k].shape)}'
        for k, v in out.items()
        if k in target and v.shape != target[k].shape
    ]
    if bad:
        raise ConversionError(
            f'{len(bad)} tensor(s) do not fit {type(model).__name__}:\n' + '\n'.join(bad[:6])
        )
    result = ConversionResult(
        state_dict=OrderedDict(),
        source_layout='official',
        sizes={prefix + k: v.numel() for k, v in target.items()},
    )
    for k in target:
        if k in out:
            result.state_dict[prefix + k] = (
                out[k].detach().clone(memory_format=torch.contiguous_format)
            )
            result.loaded.append(prefix + k)
            result.sources[prefix + k] = list(sources[k])
        else:
            result.new_other.append(prefix + k)
    for k, (v, src) in extra_out.items():
        result.state_dict[k] = v.detach().clone(memory_format=torch.contiguous_format)
        result.loaded.append(k)
        result.sources[k] = list(src)
        result.sizes[k] = v.numel()
    used = {s for k in result.loaded for s in result.sources[k]}
    result.unused = [k for k in source_keys if k not in used] + [k for k in out if k not in target]
    result.meta = dict(
        converter='mmcirc.models.convert_isotropic',
        loaded=len(result.loaded),
        new=list(result.new),
        unused=list(result.unused),
        **meta,
    )
    return result


def format_isotropic_summary(result: ConversionResult, title: str) -> str:
    """loaded / new / unused counts (and the keys of the last two)."""
    n = sum(result.sizes.get(k, 0) for k in result.loaded)
    lines = [
        title,
        f'loaded: {len(result.loaded)} tensors ({n:,} values)',
        f'new (not in the checkpoint): {len(result.new)} tensors',
    ]
    lines += [f'    {k}' for k in result.new]
    lines.append(f'unused (in the checkpoint, not loaded): {len(result.unused)} tensors')
    lines += [f'    {k}' for k in result.unused]
    return '\n'.join(lines)


# --------------------------------------------------------------------------- CA-DeiT
def cadeit_arch_of(sd) -> dict:
    """Sizes of a CA-DeiT state dict: embed_dims, depth, mlp_ratio, patch_size,
    in_channels, num_classes (None without a head) and the arch name if standard."""
    for key in ('patch_embed.proj.weight', 'blocks.0.norm1.weight', 'blocks.0.mlp.fc1.weight'):
        if key not in sd:
            raise ConversionError(f'not a CA-DeiT checkpoint: no {key}')
    w = sd['patch_embed.proj.weight']
    width = int(w.shape[0])
    depth = 1 + max(int(m.group(1)) for m in (re.match(r'^blocks\.(\d+)\.', k) for k in sd) if m)
    ratio = sd['blocks.0.mlp.fc1.weight'].shape[0] / width
    info = dict(
        embed_dims=width,
        depth=depth,
        mlp_ratio=float(ratio),
        patch_size=int(w.shape[-1]),
        in_channels=int(w.shape[1]),
        num_classes=int(sd['head.weight'].shape[0]) if 'head.weight' in sd else None,
    )
    from .backbones.ca_deit import CADeiT

    info['name'] = (
        next(
            (
                n
                for n in CADEIT_LETTERS
                if CADeiT.arch_zoo[n] == dict(embed_dims=width, depth=depth, mlp_ratio=ratio)
            ),
            None,
        )
        if info['patch_size'] == 16
        else None
    )
    return info


def convert_cadeit_official(ckpt, arch=None, meta: Optional[dict] = None):
    """``(result, model)`` for an official CA-DeiT checkpoint (``{'model': sd}`` or a
    bare state dict). ``arch`` (name or dict) must match the checkpoint if given; by
    default it is read from the tensors. ``head.*`` becomes ``head.fc.*``."""
    _expect_kind(ckpt, 'cadeit')
    sd = ckpt.get('model', ckpt.get('state_dict', ckpt))
    sd = _tensors(sd, 'CA-DeiT checkpoint')
    if all(k.startswith('module.') for k in sd):
        sd = OrderedDict((k[len('module.') :], v) for k, v in sd.items())
    info = cadeit_arch_of(sd)
    from .backbones.ca_deit import CADeiT

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
    return _result(model, out, sources, head, list(sd), m), model


# --------------------------------------------------------------------------- VECA
#: config key -> VECAViT argument, for the settings that change the model.
_VECA_CONFIG_ARGS = {
    'patch_size': 'patch_size',
    'in_channels': 'in_channels',
    'patch_embed_use_ln': 'patch_norm',
    'rope_p_zero_freqs': 'rope_p_zero_freqs',
    'rope_zero_freqs_from': 'rope_zero_freqs_from',
    'rope_shift_coords': 'rope_shift_coords',
    'rope_jitter_coords': 'rope_jitter_coords',
    'rope_rescale_coords': 'rope_rescale_coords',
    'nested_chunk_size': 'core_chunk',
    'distill_output_dim': 'out_channels',
    'dropout': 'dropout',
}


def veca_settings_of(config: dict) -> tuple:
    """``(family, kwargs)``: the official family name and the VECAViT arguments a
    saved VECA config implies (the official loader's defaults where absent)."""
    if not isinstance(config, dict):
        raise ConversionError(
            f'VECA checkpoint: "config" must be a dict, got {type(config).__name__}'
        )
    family = str(config.get('model_family', 'base')).lower()
    if family not in VECA_FAMILIES:
        raise ConversionError(
            f'VECA config model_family must be one of {VECA_FAMILIES}, got {family!r}'
        )
    config = dict(config)
    if 'matryoshka_chunk_size' in config:  # the official loader's older name
        config['nested_chunk_size'] = config['matryoshka_chunk_size']
    kwargs = {arg: config[key] for key, arg in _VECA_CONFIG_ARGS.items() if key in config}
    if kwargs.get('out_channels') is not None and family in VECA_FAMILIES:
        from .backbones.veca import VECAViT

        if kwargs['out_channels'] == VECAViT.arch_zoo[family]['embed_dims']:
            kwargs['out_channels'] = None
    return family, kwargs


def convert_veca_official(ckpt, arch=None, meta: Optional[dict] = None):
    """``(result, model)`` for an official VECA checkpoint. ``arch`` (a name or dict)
    overrides the config's ``model_family`` (the official loader has no such
    override; it is for models outside the presets, e.g. the test fixtures)."""
    _expect_kind(ckpt, 'veca')
    family, kwargs = veca_settings_of(ckpt.get('config', {}))
    sd = OrderedDict()
    for k, v in _tensors(ckpt['student'], 'VECA checkpoint "student"').items():
        for prefix in ('module.', 'student.'):  # the official loader strips these, in this order
            if k.startswith(prefix):
                k = k[len(prefix) :]
        sd[k] = v
    from .backbones.veca import VECAViT

    try:
        model = VECAViT(arch=family if arch is None else arch, **kwargs)
    except ValueError as err:
        raise ConversionError(f'cannot build VECAViT from the checkpoint config: {err}') from None
    chunks = sorted(
        int(m.group(1)) for m in (re.match(r'^query_token_chunks\.(\d+)$', k) for k in sd) if m
    )
    if (
        chunks != list(range(len(chunks)))
        or not chunks
        or [f'qcoord_chunks.{i}' in sd for i in chunks] != [True] * len(chunks)
    ):
        raise ConversionError(
            'VECA checkpoint: the core bank chunks query_token_chunks.{i} / qcoord_chunks.{i} '
            f'are missing or incomplete (found chunks {chunks}); truncated or foreign file?'
        )
    out, sources = OrderedDict(), {}
    tok = [f'query_token_chunks.{i}' for i in chunks]
    crd = [f'qcoord_chunks.{i}' for i in chunks]
    out['cores'] = torch.cat([sd[k].reshape(-1, sd[k].shape[-1]) for k in tok])  # (C, D)
    out['core_coords'] = torch.cat([sd[k].reshape(-1, 2) for k in crd])  # (C, 2)
    sources['cores'], sources['core_coords'] = tok, crd
    for k, v in sd.items():
        if k not in tok and k not in crd:
            out[k], sources[k] = v, [k]
    target = model.state_dict()
    missing = [k for k in target if k not in out]
    if missing:
        given = 'the given arch' if arch is not None else f'model_family {family!r} of its config'
        raise ConversionError(
            f'the VECA checkpoint lacks {len(missing)} tensor(s) of VECAViT for {given} '
            f'(truncated, or another family?): {missing[:4]}'
        )
    bad = [k for k in target if out[k].shape != target[k].shape]
    if bad:
        raise ConversionError(
            f'the VECA checkpoint does not fit VECAViT for model_family {family!r}'
            f'{" (given arch)" if arch is not None else ""}: '
            + '; '.join(
                f'{k}: checkpoint {tuple(out[k].shape)} vs model {tuple(target[k].shape)}'
                for k in bad[:4]
            )
        )
    import inspect

    defaults = {k: p.default for k, p in inspect.signature(VECAViT.__init__).parameters.items()}
    backbone = dict(
        type='VECAViT',
        arch=family if arch is None else arch,
        **{k: v for k, v in kwargs.items() if defaults.get(k) != v},
    )
    m = dict(
        meta or {},
        family='veca',
        model_family=family,
        backbone=backbone,
        nested_budgets=list(ckpt['config'].get('nested_budgets', []))
        if isinstance(ckpt.get('config'), dict)
        else [],
    )
    return _result(model, out, sources, OrderedDict(), list(sd), m), model


# --------------------------------------------------------------------------- file to file
def convert_isotropic_file(
    kind: str, src: str, out: Optional[str] = None, *, arch=None, trust: bool = False
):
    """Convert the official CA-DeiT (``kind='deit'``) or VECA (``'veca'``) checkpoint
    file ``src`` and save it atomically to ``out`` (default
    ``work_dirs/pretrained/<variant>_official.pth``). ``arch`` (name or dict) checks
    (CA-DeiT) or overrides (VECA) the checkpoint's arch; ``trust`` allows full
    unpickling. Returns ``(result, out, title)``; raises :class:`ConversionError`."""
    if kind not in ('deit', 'veca'):
        raise ConversionError(f"kind must be 'deit' or 'veca', got {kind!r}")
    ckpt = load_source(src, trust=trust)
    meta = dict(source=osp.basename(src))
    if kind == 'deit':
        result, model = convert_cadeit_official(ckpt, arch=arch, meta=meta)
        name = result.meta['arch']
        variant = f'ca_deit_{CADEIT_LETTERS[name]}' if isinstance(name, str) else 'ca_deit_custom'
        title = f'CA-DeiT ({name}, {model.embed_dims} wide, {model.depth} blocks) -> CADeiT + LinearClsHead'
    else:
        result, model = convert_veca_official(ckpt, arch=arch, meta=meta)
        fam = result.meta['model_family'] if arch is None else 'custom'
        variant = f'veca_{fam}'
        title = (
            f'VECA ({fam}, {model.embed_dims} wide, {model.num_layers} blocks, '
            f'{model.num_cores_max} cores) -> VECAViT'
        )
    out = out or osp.join('work_dirs', 'pretrained', f'{variant}_official.pth')
    save_checkpoint(result, out)
    return result, out, title
