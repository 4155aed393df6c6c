"""Checkpoints for the timm models: read safely, converted by mmcirc's converters.

:func:`checkpoint_filter_fn` (timm's ``pretrained_filter_fn``; also for
``timm.models.load_checkpoint(model, path, filter_fn=checkpoint_filter_fn)``) takes

* the released CA-DeiT file: :func:`~mmcirc.models.convert.deit.convert_cadeit_official`;
* the released VECA file: :func:`~mmcirc.models.convert.veca.convert_veca_official`;
  the config's settings that change the model (RoPE, patch size, ...) must be those the
  timm model was created with (ValueError naming them otherwise);
* mmcirc's own checkpoints (an mmpretrain classifier of ``configs/*_in1k.py``:
  ``backbone.*`` and ``head.fc.*``, possibly under ``state_dict`` with mmengine's
  ``meta`` / ``message_hub``; the converters' files, a converted VECA file with its
  settings checked as above from ``meta['backbone']``) and the timm models' own state
  dicts (``backbone.*``, ``head.*``);

and returns the model's keys. :func:`load_checkpoint_file` reads a file with mmcirc's
safe loader (:func:`mmcirc.models.convert.load_source`); on a torch-only install (no
mmengine) with torch's own ``weights_only`` loader.
"""

import logging
import re
from collections import OrderedDict

import torch

from mmcirc.models.backbones.contract import HAS_MMENGINE
from mmcirc.models.convert import RELEASED, ConversionError, deit, strip_common_prefix, veca
from mmcirc.models.convert.conversion import shape_mismatches

__all__ = ['checkpoint_filter_fn', 'load_checkpoint_file', 'load_into']

_logger = logging.getLogger(__name__)


def load_checkpoint_file(path: str):
    """The checkpoint at ``path``, unpickled safely (see the module docstring)."""
    if HAS_MMENGINE:
        from mmcirc.models.convert import load_source

        return load_source(path)
    return torch.load(path, map_location='cpu', weights_only=True)


def _check_veca_settings(trained: dict, model) -> None:
    """The settings a VECA checkpoint was trained with (``trained``: VECAViT arguments)
    equal those the timm model was created with
    (:func:`~mmcirc.models.convert.veca.settings_differ`); ValueError naming them."""
    differ = veca.settings_differ(trained, model.backbone_kwargs)
    if differ:
        args = ', '.join(f'{k}={v!r}' for k, v in differ.items())
        raise ValueError(
            f'the VECA checkpoint was trained with {args}: create the model with these '
            f'keyword arguments (timm.create_model(..., {args}))'
        )


def _from_mmcirc(sd) -> 'OrderedDict[str, torch.Tensor]':
    """mmcirc (mmpretrain) keys -> the timm model's: ``head.fc.*`` -> ``head.*``."""
    return OrderedDict((re.sub(r'^head\.fc\.', 'head.', k), v) for k, v in sd.items())


def checkpoint_filter_fn(state_dict, model):
    """A checkpoint (or the state dict timm unwrapped from it) in any layout of the module
    docstring -> ``model``'s keys. ConversionError (a ValueError) for anything else."""
    kind = getattr(model, 'released_kind', None)  # TimmModel.released_kind
    ckpt = state_dict
    if RELEASED['veca'].detect(ckpt):
        if kind != 'veca':
            raise ConversionError(f'a VECA checkpoint does not fit {type(model).__name__}')
        _check_veca_settings(veca.veca_settings_of(ckpt.get('config', {}))[1], model)
        result, _ = veca.convert_veca_official(ckpt, arch=model.arch)
        return _from_mmcirc(result.state_dict)
    if not isinstance(ckpt, dict):
        raise ConversionError(f'expected a checkpoint dict, got {type(ckpt).__name__}')
    sd = ckpt.get('state_dict', ckpt.get('model', ckpt))
    if not isinstance(sd, dict):
        raise ConversionError(f'expected a state dict, got {type(sd).__name__}')
    sd = strip_common_prefix(
        OrderedDict((k, v) for k, v in sd.items() if torch.is_tensor(v)), 'module.'
    )
    if not any(k.startswith('backbone.') for k in sd) and RELEASED['deit'].detect({'model': sd}):
        if kind != 'deit':
            raise ConversionError(f'a CA-DeiT checkpoint does not fit {type(model).__name__}')
        result, _ = deit.convert_cadeit_official({'model': sd}, arch=model.arch)
        return _from_mmcirc(result.state_dict)
    meta = ckpt.get('meta')
    backbone = meta.get('backbone') if isinstance(meta, dict) else None
    if kind == 'veca' and isinstance(backbone, dict):  # a converted VECA file
        _check_veca_settings(backbone, model)
    if not any(k.startswith('backbone.') for k in sd):
        raise ConversionError(
            'not a checkpoint of this model: expected the released CA-DeiT or VECA file, or '
            f'mmcirc / timm keys backbone.* and head.*; got {list(sd)[:4]}'
        )
    return _from_mmcirc(sd)


def load_into(model, ckpt) -> None:
    """Load the checkpoint ``ckpt`` into ``model`` (see :meth:`TimmModel.load_pretrained`)."""
    sd = checkpoint_filter_fn(ckpt, model)
    target = model.state_dict()
    head = [k for k in sd if k.startswith('head.')]
    if head and (model.num_classes == 0 or sd[head[0]].shape[0] != model.num_classes):
        for k in head:  # another class count: the classifier starts anew, as in timm
            del sd[k]
        why = 'checkpoint classifier (%s) not loaded: the model has %d classes'
        _logger.info(why, head, model.num_classes)
    conv = (getattr(model, 'pretrained_cfg', None) or {}).get('first_conv')
    key = f'{conv}.weight'
    if conv and key in sd and key in target and sd[key].shape[1] != target[key].shape[1]:
        from timm.models import adapt_input_conv  # timm's rule for other input channels

        sd[key] = adapt_input_conv(target[key].shape[1], sd[key])
    mismatched = shape_mismatches(sd, target)
    if mismatched:
        raise ValueError(
            f'the checkpoint does not fit {type(model).__name__}: ' + '; '.join(mismatched[:4])
        )
    new_ok = set(model.allowed_new_keys())
    missing = [k for k in target if k not in sd and not k.startswith('head.')]
    unexpected = [k for k in sd if k not in target]
    bad = [k for k in missing if k not in new_ok]
    if bad or unexpected:
        raise ValueError(
            f'the checkpoint does not fit {type(model).__name__}: '
            f'missing {bad[:4]} ({len(bad)}), unexpected {unexpected[:4]} ({len(unexpected)})'
        )
    if model.num_classes and not head:
        _logger.info('the checkpoint has no classifier: head starts at its init')
    if missing:
        _logger.warning('not in the checkpoint, left at their init: %s', missing)
    model.load_state_dict(sd, strict=False)
