"""The target of a conversion into a CA/Core pyramid (PVT / Swin families): which
class of the family table (:data:`mmcirc.models.families.FAMILIES`) is built, which of
its keys are the replaced attention, how it is described in reports and errors, and the
one :class:`ConversionResult` of a pyramid. Shared by the pyramid converter
(:mod:`.pyramid`) and CA-DeiT blocks into a pyramid (:func:`.deit.convert_cadeit`).
"""

from typing import List, Optional, Sequence

from ..families import FAMILIES
from .conversion import ConversionError, build_result

__all__ = [
    'pyramid_sources',
    'family_of',
    'build_backbone',
    'replaced_attention_keys',
    'describe',
    'pyramid_result',
]


def pyramid_sources() -> dict:
    """The pyramid families with a converter -> the module of their source layouts
    (the ``layouts`` column of the family table)."""
    return {f: row.layouts for f, row in FAMILIES.items() if row.layouts is not None}


def family_of(model) -> str:
    """The family (``'pvt'``, ``'swin'``) of a built CA/Core pyramid."""
    from ..backbones.pyramid import PyramidBackbone

    families = tuple(pyramid_sources())
    if isinstance(model, PyramidBackbone) and model.family in families:
        return model.family
    raise ConversionError(
        f'not an mmcirc pyramid with a converter ({families}): {type(model).__name__}'
    )


def build_backbone(
    family: str,
    arch='tiny',
    attention: str = 'circulant',
    stage_attentions: Optional[Sequence[str]] = None,
    **kwargs,
):
    """Build the target from the family's classes (:data:`~mmcirc.models.families.FAMILIES`):
    the one whose default attention is the one replaced kind (``CorePVT`` / ``CoreSwin``
    when the replaced stages are all core), else the family's base class (``CAPVT`` /
    ``CASwin``), with the constructor's weights, in eval mode."""
    from .. import backbones  # noqa: F401  (the pyramids enter the family table)

    if family not in pyramid_sources():
        raise ConversionError(f'family must be one of {tuple(pyramid_sources())}, got {family!r}')
    classes = FAMILIES[family].classes
    kinds = (
        [attention]
        if stage_attentions is None
        else list([stage_attentions] if isinstance(stage_attentions, str) else stage_attentions)
    )
    replaced = {k for k in kinds if k != classes[0].original_attention}
    cls = next((c for c in classes if replaced == {c.default_attention}), classes[0])
    if stage_attentions is not None:
        kwargs['stage_attentions'] = stage_attentions
    try:
        model = cls(arch=arch, attention=attention, **kwargs)
    except (ValueError, TypeError) as err:
        raise ConversionError(f'cannot build the target {cls.__name__}: {err}') from None
    model.eval()  # (mmdet Swin's train() override returns None: no chaining)
    return model


def replaced_attention_keys(model) -> List[str]:
    """State-dict keys of the replaced attention, as the blocks declare them
    (``added_keys``: e.g. circulant / core ``blocks.{j}.attn.*``, ``blocks.{j}.cpe.*``),
    and the core banks ``cores`` of the stages that carry cores."""
    from ..blocks import PyramidBlock

    attr = model.stages_attr
    keys = []
    for i, stage in enumerate(model.stages):
        if stage.cores is not None:
            keys.append(f'{attr}.{i}.cores')
        for j, block in enumerate(stage.blocks):
            if isinstance(block, PyramidBlock):
                keys += [f'{attr}.{i}.blocks.{j}.{k}' for k in block.added_state_keys()]
    return keys


def describe(model) -> str:
    """``CAPVT(embed_dims=..., depths=..., stage_attentions=...)`` (reports, errors)."""
    return (
        f'{type(model).__name__}(embed_dims={model.embed_dims}, depths={model.depths}, '
        f'stage_attentions={model.stage_attentions})'
    )


def pyramid_result(model, out, loaded_from, source_keys, layout, resized=(), meta=None):
    """:func:`mmcirc.models.convert.build_result` for a pyramid: buffers the source
    lacks from the model, the replaced attention told from the rest, the target
    described in ``meta['model']``."""
    return build_result(
        model,
        out,
        loaded_from,
        source_keys,
        layout,
        converter='mmcirc.models.convert',
        attention_keys=replaced_attention_keys(model),
        resized=resized,
        info=dict(
            source_layout=layout,
            model=dict(
                type=type(model).__name__,
                embed_dims=list(model.embed_dims),
                depths=list(model.depths),
                stage_attentions=list(model.stage_attentions),
            ),
        ),
        meta=dict(resized=list(resized), **(meta or {})),
    )
