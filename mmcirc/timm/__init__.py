"""mmcirc's models as timm models: ``import mmcirc.timm`` registers them with timm.

Registered (``timm.list_models(module='zoo')``): ``ca_deit_{tiny,small,base}``,
``veca_{small,base}`` (the core count C' an option: ``num_cores=16`` or a preset),
and the ImageNet classifiers of the pyramids, ``ca_pvt_{tiny,small,medium,large}``,
``ca_swin_{tiny,small,base}``, ``core_pvt_{tiny,small}``, ``core_swin_{tiny,small}``::

    import timm
    import mmcirc.timm  # noqa: F401  (registration)

    model = timm.create_model(
        'ca_deit_small', pretrained=True,
        pretrained_cfg_overlay=dict(file='ca_deit_small.pth'))   # the released file
    feats = timm.create_model('ca_swin_tiny', features_only=True, out_indices=(0, 1, 2, 3))

Their weights come from a local file only (:mod:`.zoo`, :mod:`.weights`); they keep
timm's interface (:class:`~mmcirc.timm.model.TimmModel`). Needs timm and torch; the
pyramids also mmdet (imported when one is built). ``import mmcirc`` never imports timm.
"""

from .isotropic import CADeiTTimm, VECATimm
from .model import TimmModel
from .pyramid import PyramidTimm
from .weights import checkpoint_filter_fn, load_checkpoint_file
from .zoo import MODEL_NAMES

__all__ = [
    'CADeiTTimm',
    'MODEL_NAMES',
    'PyramidTimm',
    'TimmModel',
    'VECATimm',
    'checkpoint_filter_fn',
    'load_checkpoint_file',
]
