"""Row-banded maps over torch.distributed (gloo on CPU, NCCL on GPU), torch only: the
layer below the operators' sharded handlers (:mod:`mmcirc.ops.circulant_sharded`,
:mod:`mmcirc.ops.core_sharded`) and the sharded segmentor (:mod:`mmcirc.parallel`).

One whole image is computed by P processes that each hold one horizontal band of rows
of every feature map. The split is :func:`band_bounds`; :func:`run_parallel` runs a
function on P local ranks (tests, ``--nproc``), ``torchrun`` launches real runs.

Modules: :mod:`.bands` (the band rule), :mod:`.comm` (the row exchange of banded maps),
:mod:`.layers` (the row exchanges of convolutions, interpolation, pooling, GroupNorm),
:mod:`.fft` (the distributed FFT of the circulant operator), :mod:`.banded` /
:mod:`.handlers` (the row-banded map :class:`BandedMap` and its per-op handlers),
:mod:`.launch` (local ranks, first-cause errors)."""

from .comm import Layout, exchange_rows, gather_rows

from .bands import band_bounds, check_world_size
from .launch import free_port, init_from_env, leaving_group, run_parallel
from .fft import sharded_irfft2, sharded_rfft2
from .banded import BandedMap
from . import handlers  # noqa: F401  (registers the BandedMap handlers)

__all__ = [
    'BandedMap',
    'band_bounds',
    'check_world_size',
    'free_port',
    'init_from_env',
    'leaving_group',
    'run_parallel',
    'sharded_rfft2',
    'sharded_irfft2',
    'exchange_rows',
    'gather_rows',
    'Layout',
]
