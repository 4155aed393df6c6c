"""Attention operators of mmcirc (torch only, no mmengine/mmcv imports)."""

from .circulant import CirculantAttention, fft_grid, next_fast_len
from .circulant_functional import circulant_attention
from .core import CoreAttention, select_cores

__all__ = [
    'circulant_attention',
    'CirculantAttention',
    'fft_grid',
    'next_fast_len',
    'CoreAttention',
    'select_cores',
]
