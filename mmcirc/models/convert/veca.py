"""VECA checkpoints (github.com/alansong1322/VECA) for mmcirc's :class:`VECAViT`
(``tools/model_converters/veca_to_mmcirc.py``).

The released file: ``{'student': state_dict, 'config': {...}, ...}`` (keys possibly
``module.`` / ``student.`` prefixed; optimizer states and the rest are ignored). The
arch comes from ``config['model_family']`` (the official loader's rule: the family
preset decides the sizes, 'base' when absent); the core bank chunks
``query_token_chunks.{i}`` / ``qcoord_chunks.{i}`` become ``cores`` / ``core_coords``;
everything else keeps its name under ``backbone.``. The config's settings that change
the model (patch size, patch LN, RoPE, output projection, chunk) are checked against
the tensors and written to ``meta['backbone']`` (the arguments a config must give
:class:`VECAViT`). Torch only at import.
"""

import inspect
import os.path as osp
import re
from collections import OrderedDict
from typing import Optional

import torch

from ..families import register_converter
from .conversion import (
    OUTPUT_ROOT,
    ConversionError,
    expect_released,
    isotropic_result,
    shape_mismatches,
    tensors_of,
)

__all__ = [
    'VECA_FAMILIES',
    'convert_source',
    'convert_veca_official',
    'settings_differ',
    'veca_settings_of',
]

#: The official model families (``config['model_family']``).
VECA_FAMILIES = ('small', 'splus', 'base', 'large')

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


#: The VECAViT arguments of :data:`_VECA_CONFIG_ARGS` that change a trained model's function
#: (not the input channels, which a loader may adapt, nor dropout, training only).
_FUNCTION_ARGS = tuple(a for a in _VECA_CONFIG_ARGS.values() if a not in ('in_channels', 'dropout'))


def _defaults() -> dict:
    from ..backbones.veca import VECAViT

    return {k: p.default for k, p in inspect.signature(VECAViT.__init__).parameters.items()}


def settings_differ(trained: dict, given: dict) -> dict:
    """``{argument: trained value}`` of the VECAViT arguments that change a trained
    model's function where those a checkpoint was trained with (``trained``) and the
    ``given`` ones differ, the defaults where absent."""
    defaults = _defaults()
    return {
        k: trained.get(k, defaults[k])
        for k in _FUNCTION_ARGS
        if trained.get(k, defaults[k]) != given.get(k, defaults[k])
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
    if kwargs.get('out_channels') is not None:
        from ..backbones.veca import VECAViT

        if kwargs['out_channels'] == VECAViT.arch_zoo[family]['embed_dims']:
            kwargs['out_channels'] = None
    return family, kwargs


def convert_veca_official(ckpt, arch=None, meta: Optional[dict] = None):
    """``(result, model)`` for an official VECA checkpoint. ``arch`` (a name or dict)
    overrides the config's ``model_family`` (the official loader has no such
    override; it is for models outside the presets, e.g. the test fixtures)."""
    expect_released(ckpt, 'veca')
    family, kwargs = veca_settings_of(ckpt.get('config', {}))
    sd = OrderedDict()
    for k, v in tensors_of(ckpt['student'], 'VECA checkpoint "student"').items():
        for prefix in ('module.', 'student.'):  # the official loader strips these, in this order
            if k.startswith(prefix):
                k = k[len(prefix) :]
        sd[k] = v
    from ..backbones.veca import VECAViT

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
    bad = shape_mismatches(out, target)
    if bad:
        raise ConversionError(
            f'the VECA checkpoint does not fit VECAViT for model_family {family!r}'
            f'{" (given arch)" if arch is not None else ""}: ' + '; '.join(bad[:4])
        )
    defaults = _defaults()
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
        nested_budgets=list(ckpt.get('config', {}).get('nested_budgets', [])),
    )
    return isotropic_result(model, out, sources, sd, m), model


def convert_source(src, load, meta, *, arch=None):
    """The released VECA file ``src`` for :class:`VECAViT` (``arch``: overrides the
    config's family; see :func:`mmcirc.models.convert.convert_file`)."""
    result, model = convert_veca_official(load(src), arch=arch, meta=meta)
    family = result.meta['model_family'] if arch is None else 'custom'
    title = (
        f'VECA ({family}, {model.embed_dims} wide, {model.num_layers} blocks, '
        f'{model.num_cores_max} cores) -> VECAViT'
    )
    return result, osp.join(OUTPUT_ROOT, f'veca_{family}_official.pth'), title


register_converter('veca', convert_source)
