"""Inference helpers built on the OpenMMLab APIs (mmseg's ``init_model`` and its
whole-image inference). ``import mmcirc.apis`` needs mmseg; ``import mmcirc`` does not
import this package. The command line around them is ``tools/infer_highres.py``."""

from . import highres
from .highres import *  # noqa: F401,F403  (the public names listed in highres.__all__)

__all__ = list(highres.__all__)
