"""Backbone overrides: ``num_cores``, ``boundary``, ``scale`` and ``stage_attentions``
written into a config's backbone *before* the model is built and checked against what
that backbone takes (:func:`validate_overrides`, :func:`apply_backbone_overrides`;
:func:`backbone_summary` says what a built one has). The tools' flags for them are
:func:`mmcirc.cli.common.add_override_args`'s.
"""

import inspect
from typing import Dict, Tuple

from mmcirc.models.backbones.pyramid import PyramidBackbone
from mmcirc.models.families import FAMILIES, attention_blocks
from mmcirc.ops.circulant import BOUNDARIES, SCALES, CirculantAttention, check_choice, check_scale
from mmcirc.ops.core import CORE_PRESETS, parse_num_cores

__all__ = [
    'BACKBONE_OVERRIDES',
    'OVERRIDE_KEYS',
    'apply_backbone_overrides',
    'backbone_config',
    'backbone_on_meta',
    'backbone_overrides_of',
    'backbone_summary',
    'overridable_backbones',
    'validate_overrides',
]

#: Allowed values of the backbone overrides (num_cores: also an int in [1, num_cores_max],
#: or what the model's own bank allows; stage_attentions: the kinds the pyramids of
#: :data:`~mmcirc.models.families.FAMILIES` take, their ``attention_blocks``).
BACKBONE_OVERRIDES = {
    'num_cores': tuple(CORE_PRESETS),
    'boundary': tuple(BOUNDARIES),
    'scale': tuple(SCALES),
}
#: Every backbone override, in the order they are applied.
OVERRIDE_KEYS = ('stage_attentions', 'num_cores', 'boundary', 'scale')


def validate_overrides(
    num_cores=None, boundary=None, scale=None, stage_attentions=None
) -> Dict[str, object]:
    """Check the backbone overrides (e.g. given on a command line as strings); returns
    the ones set: ``num_cores`` as an int or a preset name of ``CORE_PRESETS`` (kept
    by name), ``scale`` as ``'sqrt_n'``/``'n'``/float, ``stage_attentions`` as a str
    or a tuple. Validated values pass again unchanged. A ``ValueError`` starts with
    the parameter's name and lists its allowed values."""
    out = {}
    if num_cores is not None:
        n = parse_num_cores(num_cores)
        preset = isinstance(num_cores, str) and num_cores in CORE_PRESETS
        out['num_cores'] = num_cores if preset else n
    if boundary is not None:
        check_choice('boundary', boundary, BACKBONE_OVERRIDES['boundary'])
        out['boundary'] = boundary
    if scale is not None:
        value = scale
        if value not in BACKBONE_OVERRIDES['scale']:
            try:  # a command line's string; the check is the operator's own
                value = float(value)
                check_scale(value)
            except (TypeError, ValueError):
                raise ValueError(
                    f'scale must be one of {BACKBONE_OVERRIDES["scale"]} or a positive '
                    f'float, got {scale!r}'
                ) from None
        out['scale'] = value
    if stage_attentions is not None:
        kinds = stage_attentions
        if isinstance(kinds, str):
            kinds = [k.strip() for k in kinds.split(',')] if ',' in kinds else kinds
        choices = tuple(attention_blocks())
        for k in [kinds] if isinstance(kinds, str) else kinds:
            if k not in choices:
                raise ValueError(
                    f'stage_attentions must be one of {choices} (or one per stage, comma '
                    f'separated), got {stage_attentions!r}'
                )
        out['stage_attentions'] = kinds if isinstance(kinds, str) else tuple(kinds)
    return out


def _backbone_class(type_name):
    from mmcirc.registry import model_registries

    return model_registries()[0].get(type_name)


def backbone_config(cfg):
    """The backbone's config in a full config: ``cfg.model.backbone``, or ``cfg.model``
    itself when the model is a bare backbone (``model=dict(type='CAPVT', ...)``)."""
    model = cfg['model']
    return model['backbone'] if 'backbone' in model else model


def backbone_overrides_of(cls) -> Tuple[str, ...]:
    """The overrides (:data:`OVERRIDE_KEYS`) a backbone class takes: its constructor's
    parameters among them (``stage_attentions`` only where the class can say which
    attention kinds it takes, i.e. the pyramids)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return ()
    keys = tuple(k for k in OVERRIDE_KEYS if k in params)
    if not hasattr(cls, 'attention_choices'):
        keys = tuple(k for k in keys if k != 'stage_attentions')
    return keys


def overridable_backbones() -> Tuple[str, ...]:
    """Names of the backbones of :data:`~mmcirc.models.families.FAMILIES` that take an
    override."""
    return tuple(
        cls.__name__
        for family in FAMILIES.values()
        for cls in family.classes
        if backbone_overrides_of(cls)
    )


def apply_backbone_overrides(cfg, overrides: Dict[str, object]):
    """Write ``overrides`` (raw or from :func:`validate_overrides`: they are validated
    here) into the config's backbone (:func:`backbone_config`, in place) and check
    them against that backbone; returns ``cfg``.

    Pyramids (:class:`PyramidBackbone`): ``stage_attentions`` must be kinds the family
    takes, ``num_cores`` must not exceed ``num_cores_max``; an override that the
    configured stages do not use (``num_cores`` without a core stage, ``boundary`` or
    ``scale`` without a circulant stage) is refused. Other backbones (CA-DeiT, VECA): each override must be a
    constructor parameter, and the backbone is built with them on the ``meta`` device
    (no memory, no weights), so that its own checks run now (e.g. VECA's ``num_cores``:
    a multiple of its chunk within its core bank). ``ValueError`` otherwise.
    """
    if not overrides:
        return cfg
    unknown = sorted(set(overrides) - set(OVERRIDE_KEYS))
    if unknown:
        raise ValueError(f'overrides must be among {OVERRIDE_KEYS}, got {unknown}')
    overrides = validate_overrides(**overrides)
    if not overrides:  # every value None
        return cfg
    backbone = backbone_config(cfg)
    btype = backbone.get('type')
    cls = _backbone_class(btype) if isinstance(btype, str) else btype
    takes = backbone_overrides_of(cls) if isinstance(cls, type) else ()
    if not takes:
        raise ValueError(
            f'backbone overrides {sorted(overrides)} need an mmcirc backbone '
            f'{overridable_backbones()}, the config has {btype!r}'
        )
    for key in OVERRIDE_KEYS:
        if key in overrides and key not in takes:
            raise ValueError(f'{key} does not apply to {cls.__name__}: it takes {takes}')
    if issubclass(cls, PyramidBackbone):
        _apply_to_pyramid(backbone, cls, overrides)
    else:
        for key in OVERRIDE_KEYS:
            if key in overrides:
                backbone[key] = overrides[key]
        backbone_on_meta(backbone)
    return cfg


def _apply_to_pyramid(backbone, cls, overrides) -> None:
    btype = cls.__name__
    if 'stage_attentions' in overrides:
        choices = cls.attention_choices()
        kinds = overrides['stage_attentions']
        for k in [kinds] if isinstance(kinds, str) else kinds:
            if k not in choices:
                raise ValueError(f'stage_attentions: {btype} takes {choices}, got {k!r}')
        backbone['stage_attentions'] = kinds if isinstance(kinds, str) else list(kinds)
    keys = ('attention', 'stage_attentions', 'block_cfgs', 'arch')
    kinds = cls.configured_stage_attentions(**{k: backbone[k] for k in keys if k in backbone})
    blocks = [cls.attention_blocks[k] for k in kinds]
    if 'num_cores' in overrides:
        n = overrides['num_cores']
        parse_num_cores(n, maximum=backbone.get('num_cores_max', 64))
        if not any(b.carries_cores for b in blocks):
            takes = tuple(k for k, blk in cls.attention_blocks.items() if blk.carries_cores)
            raise ValueError(
                f'num_cores does nothing here: {btype} has no core stage {tuple(kinds)}; '
                f'it applies to stages of kind {takes}'
            )
        backbone['num_cores'] = n
    for key in ('boundary', 'scale'):
        if key in overrides:
            if not any(key in b.options for b in blocks):
                takes = tuple(k for k, blk in cls.attention_blocks.items() if key in blk.options)
                raise ValueError(
                    f'{key} does nothing here: {btype} has no circulant stage {tuple(kinds)}; '
                    f'it applies to stages of kind {takes}'
                )
            backbone[key] = overrides[key]


def backbone_on_meta(backbone_cfg):
    """The backbone of ``backbone_cfg`` (a dict with ``type``) built on the ``meta``
    device: its constructor's checks, no memory, no weights. Its own ValueError /
    TypeError propagate."""
    import torch

    btype = backbone_cfg['type']
    cls = _backbone_class(btype) if isinstance(btype, str) else btype
    if cls is None:
        raise ValueError(f'model.backbone.type {btype!r} is not a registered model')
    kwargs = {k: v for k, v in backbone_cfg.items() if k not in ('type', 'init_cfg')}
    with torch.device('meta'):
        return cls(**kwargs)


def backbone_summary(backbone) -> dict:
    """Type, per-stage attention and the circulant/core settings of a built backbone.

    Pyramids say it through their blocks (``block_types``: options, carries_cores);
    other backbones through their modules: the circulant attention's ``boundary`` /
    ``scale``, the model's ``num_cores`` / ``num_cores_max`` (VECA)."""
    out = dict(type=type(backbone).__name__)
    kinds = getattr(backbone, 'stage_attentions', None)
    if kinds is not None:
        out['stage_attentions'] = list(kinds)
        blocks = getattr(backbone, 'block_types', ())
        if any('boundary' in b.options for b in blocks):
            out.update(boundary=backbone.boundary, scale=backbone.scale)
        if any(b.carries_cores for b in blocks):
            out.update(num_cores=backbone.num_cores, num_cores_max=backbone.num_cores_max)
        return out
    circ = next((m for m in backbone.modules() if isinstance(m, CirculantAttention)), None)
    if circ is not None:
        out.update(boundary=circ.boundary, scale=circ.scale)
    if getattr(backbone, 'num_cores', None) is not None and hasattr(backbone, 'num_cores_max'):
        out.update(num_cores=backbone.num_cores, num_cores_max=backbone.num_cores_max)
    return out
