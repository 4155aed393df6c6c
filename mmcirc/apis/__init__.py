"""Inference on the OpenMMLab APIs: the one model builder (:mod:`.builder`), the backbone
overrides (:mod:`.overrides`), how a checkpoint's weights fit a model
(:mod:`.weights`), a segmentor's logits as mmseg's ``encode_decode`` makes
them (:mod:`.decode`) and whole-image high-resolution segmentation (:mod:`.highres`; its
command line is ``tools/infer_highres.py``). ``import mmcirc`` does not import this
package; its public names are those of the five modules."""

from . import builder, decode, highres, overrides, weights
from .builder import *  # noqa: F401,F403
from .decode import *  # noqa: F401,F403
from .highres import *  # noqa: F401,F403
from .overrides import *  # noqa: F401,F403
from .weights import *  # noqa: F401,F403

__all__ = [*builder.__all__, *decode.__all__, *overrides.__all__, *highres.__all__]
__all__ += [*weights.__all__]
