"""Attention operators of mmcirc (torch only, no mmengine/mmcv imports)."""

from .circulant import CirculantAttention, circulant_attention, fft_grid, next_fast_len
from .core import CoreAttention, select_cores

__all__ = [
    'circulant_attention',
    'CirculantAttention',
    'fft_grid',
    'next_fast_len',
    'CoreAttention',
    'select_cores',
]
