"""Measurement helpers: FLOP counting with FFT / softmax / SDPA handles for
mmengine's counter (see :mod:`mmcirc.analysis.flops` for the convention)."""
from .flops import (COMPLEX_MUL_MACS, FFT_COMPLEX_MACS, FFT_REAL_MACS,
                    FLOP_HANDLES, FREE_OPS, REAL_COMPLEX_MUL_MACS,
                    SOFTMAX_MACS, add_flop_handles, attention_modules,
                    count_flops, count_params, fft_macs, flop_counter,
                    get_complexity, meta_compat,
                    register_flop_handles)


def __getattr__(name):
    if name == 'FlopCounter':
        from .flops import _flop_analyzer_cls
        return _flop_analyzer_cls()
    raise AttributeError(name)


__all__ = [
    'FFT_COMPLEX_MACS', 'FFT_REAL_MACS', 'COMPLEX_MUL_MACS',
    'REAL_COMPLEX_MUL_MACS', 'SOFTMAX_MACS', 'fft_macs', 'FLOP_HANDLES',
    'FREE_OPS', 'FlopCounter', 'add_flop_handles', 'register_flop_handles',
    'count_flops', 'flop_counter', 'get_complexity', 'count_params',
    'attention_modules', 'meta_compat'
]
