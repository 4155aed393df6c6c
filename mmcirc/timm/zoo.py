"""The registered timm models and their pretrained configs (``timm.list_models(module='zoo')``
after ``import mmcirc.timm``).

No config names a download: the weights come from a local file,
``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=PATH))``,
read by the model's ``load_pretrained`` (``custom_load``; :mod:`.weights`): the released
CA-DeiT / VECA files as they are, or mmcirc's own checkpoints.
"""

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from .model import CADeiTTimm, VECATimm
from .pyramid import PyramidTimm
from .weights import checkpoint_filter_fn

__all__ = ['MODEL_NAMES']

#: name -> (model class, fixed arguments).
_MODELS = {
    **{f'ca_deit_{a}': (CADeiTTimm, dict(arch=a)) for a in ('tiny', 'small', 'base')},
    **{f'veca_{a}': (VECATimm, dict(arch=a)) for a in ('small', 'base')},
    **{
        f'ca_pvt_{a}': (PyramidTimm, dict(family='ca_pvt', arch=a))
        for a in ('tiny', 'small', 'medium', 'large')
    },
    **{
        f'ca_swin_{a}': (PyramidTimm, dict(family='ca_swin', arch=a))
        for a in ('tiny', 'small', 'base')
    },
    **{f'core_pvt_{a}': (PyramidTimm, dict(family='core_pvt', arch=a)) for a in ('tiny', 'small')},
    **{
        f'core_swin_{a}': (PyramidTimm, dict(family='core_swin', arch=a)) for a in ('tiny', 'small')
    },
}
MODEL_NAMES = tuple(_MODELS)

_FIRST_CONV = {
    CADeiTTimm: 'backbone.patch_embed.proj',
    VECATimm: 'backbone.patch_embed.proj',
    'pvt': 'backbone.layers.0.patch_embed.projection',
    'swin': 'backbone.patch_embed.projection',
}


def _cfg(name: str, **kwargs) -> dict:
    """The ImageNet evaluation of mmcirc's configs (and of the official CA-DeiT): the
    short edge resized to 256 (bicubic), a 224 centre crop, ImageNet mean / std."""
    cls, fixed = _MODELS[name]
    first = _FIRST_CONV.get(cls) or _FIRST_CONV[fixed['family'].split('_')[1]]
    cfg = dict(
        input_size=(3, 224, 224),
        crop_pct=0.875,
        interpolation='bicubic',
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
        num_classes=1000,
        first_conv=first,
        classifier='head',
        fixed_input_size=False,
        custom_load=True,
    )
    return dict(cfg, **kwargs)


def _tag(name: str) -> str:
    if name.startswith('ca_deit'):
        return 'official_in1k'  # the released file (github.com/LeapLabTHU/Circulant-Attention)
    if name.startswith('veca'):
        return 'official'  # the released self-distilled model, no classifier
    return 'mmcirc_in1k'  # a checkpoint of configs/<name>_in1k.py


#: where the released weights come from (the pyramids: mmcirc's own training).
_ORIGIN = {
    'ca_deit': dict(origin_url='https://github.com/LeapLabTHU/Circulant-Attention'),
    'veca': dict(origin_url='https://github.com/alansong1322/VECA', num_classes=0),
}

default_cfgs = generate_default_cfgs(
    {f'{n}.{_tag(n)}': _cfg(n, **_ORIGIN.get(n.rsplit('_', 1)[0], {})) for n in MODEL_NAMES}
)


def _create(name: str, pretrained: bool = False, **kwargs):
    """Build the registered model ``name`` with timm's builder (see the module)."""
    cls, fixed = _MODELS[name]
    overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {})
    overlay.setdefault('custom_load', True)  # mmcirc's safe loader and converters
    features = bool(kwargs.get('features_only', False))
    if not features and 'out_indices' in kwargs:
        raise ValueError(f'{name}: out_indices is an option of features_only=True only')
    if cls is PyramidTimm:
        default_out = (0, 1, 2, 3)
        if features:
            kwargs['feature_indices'] = kwargs.get('out_indices', default_out)
    else:
        default_out = (2, 5, 8, 11)  # four blocks of the 12, as dense heads take them
    return build_model_with_cfg(
        cls,
        name,
        pretrained,
        pretrained_cfg_overlay=overlay,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(feature_cls='getter', out_indices=default_out),
        **dict(fixed, **kwargs),  # an arch (name or dict) given overrides the variant's
    )


def _entrypoint(name: str):
    def fn(pretrained: bool = False, **kwargs):
        return _create(name, pretrained=pretrained, **kwargs)

    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    fn.__doc__ = f'{name} (mmcirc): see mmcirc.timm.'
    return fn


for _name in MODEL_NAMES:
    globals()[_name] = register_model(_entrypoint(_name))
del _name
