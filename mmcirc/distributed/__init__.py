"""Spatial parallelism: one whole image computed by P processes (gloo on CPU, NCCL on
GPU), each holding one horizontal band of rows of every feature map, the models' own
forwards run unchanged on row-banded maps.

Torch only, here: :mod:`.row_split` (the band rule), :mod:`.comm` (the row exchange),
:mod:`.layers` (the row exchanges of convolutions, interpolation, pooling, GroupNorm),
:mod:`.fft` (the distributed FFT), :mod:`.banded_map` (:class:`BandedMap` and its handler
registry), :mod:`.launch` (:func:`run_parallel`: P local ranks, first-cause errors).
Built on them: :mod:`.handlers` (every per-op handler and the sharded operators) and
:mod:`.segmentor` (mmseg segmentors sharded: inference and training)."""

from .row_split import band_bounds, check_world_size
from .launch import free_port, leaving_group, run_parallel
from .banded_map import BandedMap
from .handlers import torch_functions  # noqa: F401  (registers the BandedMap handlers)

__all__ = [
    'BandedMap',
    'band_bounds',
    'check_world_size',
    'free_port',
    'leaving_group',
    'run_parallel',
]
