"""Backbones registered into mmdet, mmseg and mmpretrain."""
from .backbones import *  # noqa: F401,F403
