"""The registered timm models and their pretrained configs (``timm.list_models(module='zoo')``
after ``import mmcirc.timm``).

No config names a download: the weights come from a local file,
``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=PATH))``,
read by the model's ``load_pretrained`` (``custom_load``; :mod:`.weights`): the released
CA-DeiT / VECA files as they are, or mmcirc's own checkpoints.
"""

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from .isotropic import CADeiTTimm, VECATimm
from .model import FeatureGetter, FeatureGraph
from .pyramid import PyramidTimm
from .weights import checkpoint_filter_fn

__all__ = ['MODEL_NAMES']

#: model class per name prefix (the family)
_CLASSES = {'ca_deit': CADeiTTimm, 'veca': VECATimm}

_FIRST_CONV = {
    'ca_deit': 'backbone.patch_embed.proj',
    'veca': 'backbone.patch_embed.proj',
    'pvt': 'backbone.layers.0.patch_embed.projection',
    'swin': 'backbone.patch_embed.projection',
}


def _cfg(first_conv: str, **kwargs) -> dict:
    """The ImageNet evaluation of mmcirc's configs (and of the official CA-DeiT): the
    short edge resized to 256 (bicubic), a 224 centre crop, ImageNet mean / std."""
    cfg = dict(
        input_size=(3, 224, 224),
        pool_size=None,
        crop_pct=0.875,
        interpolation='bicubic',
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
        num_classes=1000,
        first_conv=first_conv,
        classifier='head',
        fixed_input_size=False,
        custom_load=True,
    )
    return dict(cfg, **kwargs)


def _pyramid_cfg(kind: str) -> dict:
    """A pyramid classifier (a checkpoint of configs/<name>_in1k.py): the 7x7 map of the
    last stage at 224. CA/Core-PVT keep PVT's spatial-reduction attention in stage 3
    (ratio 2 at stride 16), which needs a 2x2 map there: 17x17 images at least."""
    extra = dict(min_input_size=(3, 17, 17)) if kind == 'pvt' else {}
    return _cfg(_FIRST_CONV[kind], pool_size=(7, 7), **extra)


_CA_DEIT = dict(origin_url='https://github.com/LeapLabTHU/Circulant-Attention')
_VECA = dict(origin_url='https://github.com/alansong1322/VECA', num_classes=0)

#: ``.official_in1k`` the released CA-DeiT file, ``.official`` the released
#: self-distilled VECA (no classifier), ``.mmcirc_in1k`` a checkpoint of
#: configs/<name>_in1k.py.
default_cfgs = generate_default_cfgs(
    {
        'ca_deit_tiny.official_in1k': _cfg(_FIRST_CONV['ca_deit'], **_CA_DEIT),
        'ca_deit_small.official_in1k': _cfg(_FIRST_CONV['ca_deit'], **_CA_DEIT),
        'ca_deit_base.official_in1k': _cfg(_FIRST_CONV['ca_deit'], **_CA_DEIT),
        'veca_small.official': _cfg(_FIRST_CONV['veca'], **_VECA),
        'veca_base.official': _cfg(_FIRST_CONV['veca'], **_VECA),
        'ca_pvt_tiny.mmcirc_in1k': _pyramid_cfg('pvt'),
        'ca_pvt_small.mmcirc_in1k': _pyramid_cfg('pvt'),
        'ca_pvt_medium.mmcirc_in1k': _pyramid_cfg('pvt'),
        'ca_pvt_large.mmcirc_in1k': _pyramid_cfg('pvt'),
        'ca_swin_tiny.mmcirc_in1k': _pyramid_cfg('swin'),
        'ca_swin_small.mmcirc_in1k': _pyramid_cfg('swin'),
        'ca_swin_base.mmcirc_in1k': _pyramid_cfg('swin'),
        'core_pvt_tiny.mmcirc_in1k': _pyramid_cfg('pvt'),
        'core_pvt_small.mmcirc_in1k': _pyramid_cfg('pvt'),
        'core_swin_tiny.mmcirc_in1k': _pyramid_cfg('swin'),
        'core_swin_small.mmcirc_in1k': _pyramid_cfg('swin'),
    }
)


def _create(variant: str, pretrained: bool, model_args: dict, **kwargs):
    """Build ``variant`` with timm's builder (``model_args`` of the entry point, then the
    caller's keyword arguments; an arch given overrides the variant's)."""
    kwargs = dict(model_args, **kwargs)
    cls = PyramidTimm if kwargs.get('family') else _CLASSES[variant.rsplit('_', 1)[0]]
    overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {})
    overlay.setdefault('custom_load', True)  # mmcirc's safe loader and converters
    features = bool(kwargs.get('features_only', False))
    if not features and 'out_indices' in kwargs:
        raise ValueError(f'{variant}: out_indices is an option of features_only=True only')
    feature_cls = kwargs.pop('feature_cls', 'getter')
    if features and isinstance(feature_cls, str) and feature_cls not in ('getter', 'fx'):
        raise ValueError(f"{variant}: feature_cls must be 'getter' or 'fx', got {feature_cls!r}")
    if isinstance(feature_cls, str):  # timm's getter and fx extractor, mmcirc's versions
        feature_cls = dict(getter=FeatureGetter, fx=FeatureGraph).get(feature_cls, feature_cls)
    if cls is PyramidTimm:
        default_out = (0, 1, 2, 3)
        if features:
            kwargs['feature_indices'] = kwargs.get('out_indices', default_out)
    else:  # four blocks, evenly spaced, the last included: (2, 5, 8, 11) of 12
        depth = cls.depth_of(kwargs.get('arch'))
        default_out = tuple(sorted({max(k * depth // 4 - 1, 0) for k in range(1, 5)}))
    return build_model_with_cfg(
        cls,
        variant,
        pretrained,
        pretrained_cfg_overlay=overlay,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(feature_cls=feature_cls, out_indices=default_out),
        **kwargs,
    )


@register_model
def ca_deit_tiny(pretrained: bool = False, **kwargs):
    """CA-DeiT-Tiny: 192 wide, 12 blocks of circulant attention (the released model)."""
    return _create('ca_deit_tiny', pretrained, dict(arch='tiny'), **kwargs)


@register_model
def ca_deit_small(pretrained: bool = False, **kwargs):
    """CA-DeiT-Small: 384 wide, 12 blocks of circulant attention (the released model)."""
    return _create('ca_deit_small', pretrained, dict(arch='small'), **kwargs)


@register_model
def ca_deit_base(pretrained: bool = False, **kwargs):
    """CA-DeiT-Base: 768 wide, 12 blocks of circulant attention (the released model)."""
    return _create('ca_deit_base', pretrained, dict(arch='base'), **kwargs)


@register_model
def veca_small(pretrained: bool = False, **kwargs):
    """VECA-Small: 384 wide, 12 core-attention blocks, 64 cores (the released encoder)."""
    return _create('veca_small', pretrained, dict(arch='small'), **kwargs)


@register_model
def veca_base(pretrained: bool = False, **kwargs):
    """VECA-Base: 768 wide, 12 core-attention blocks, 64 cores (the released encoder)."""
    return _create('veca_base', pretrained, dict(arch='base'), **kwargs)


@register_model
def ca_pvt_tiny(pretrained: bool = False, **kwargs):
    """CA-PVT-Tiny: PVT-Tiny with circulant attention in stages 1-2."""
    return _create('ca_pvt_tiny', pretrained, dict(family='ca_pvt', arch='tiny'), **kwargs)


@register_model
def ca_pvt_small(pretrained: bool = False, **kwargs):
    """CA-PVT-Small: PVT-Small with circulant attention in stages 1-2."""
    return _create('ca_pvt_small', pretrained, dict(family='ca_pvt', arch='small'), **kwargs)


@register_model
def ca_pvt_medium(pretrained: bool = False, **kwargs):
    """CA-PVT-Medium: PVT-Medium with circulant attention in stages 1-2."""
    return _create('ca_pvt_medium', pretrained, dict(family='ca_pvt', arch='medium'), **kwargs)


@register_model
def ca_pvt_large(pretrained: bool = False, **kwargs):
    """CA-PVT-Large: PVT-Large with circulant attention in stages 1-2."""
    return _create('ca_pvt_large', pretrained, dict(family='ca_pvt', arch='large'), **kwargs)


@register_model
def ca_swin_tiny(pretrained: bool = False, **kwargs):
    """CA-Swin-T: Swin-T with circulant attention in stages 1-2."""
    return _create('ca_swin_tiny', pretrained, dict(family='ca_swin', arch='tiny'), **kwargs)


@register_model
def ca_swin_small(pretrained: bool = False, **kwargs):
    """CA-Swin-S: Swin-S with circulant attention in stages 1-2."""
    return _create('ca_swin_small', pretrained, dict(family='ca_swin', arch='small'), **kwargs)


@register_model
def ca_swin_base(pretrained: bool = False, **kwargs):
    """CA-Swin-B: Swin-B with circulant attention in stages 1-2."""
    return _create('ca_swin_base', pretrained, dict(family='ca_swin', arch='base'), **kwargs)


@register_model
def core_pvt_tiny(pretrained: bool = False, **kwargs):
    """Core-PVT-Tiny: PVT-Tiny with core attention in stages 1-2."""
    return _create('core_pvt_tiny', pretrained, dict(family='core_pvt', arch='tiny'), **kwargs)


@register_model
def core_pvt_small(pretrained: bool = False, **kwargs):
    """Core-PVT-Small: PVT-Small with core attention in stages 1-2."""
    return _create('core_pvt_small', pretrained, dict(family='core_pvt', arch='small'), **kwargs)


@register_model
def core_swin_tiny(pretrained: bool = False, **kwargs):
    """Core-Swin-T: Swin-T with core attention in stages 1-2."""
    return _create('core_swin_tiny', pretrained, dict(family='core_swin', arch='tiny'), **kwargs)


@register_model
def core_swin_small(pretrained: bool = False, **kwargs):
    """Core-Swin-S: Swin-S with core attention in stages 1-2."""
    return _create('core_swin_small', pretrained, dict(family='core_swin', arch='small'), **kwargs)


#: the registered names, in registration order
MODEL_NAMES = tuple(n.split('.')[0] for n in default_cfgs)
