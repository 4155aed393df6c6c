"""Spatial parallelism: one whole image computed by P processes that each hold one
horizontal band of rows of every feature map (torch.distributed; gloo on CPU, NCCL on
GPU). The split is :func:`band_bounds`; :func:`run_parallel` runs a function on P local
ranks (tests, ``--nproc``), ``torchrun`` launches real runs.

Modules: :mod:`.comm` (the row exchange of band-sharded maps), :mod:`.layers` (sharded
convolutions, interpolation, pooling, GroupNorm), :mod:`.fft` / :mod:`.circulant` /
:mod:`.core` (the sharded attention operators); with the OpenMMLab libraries,
:mod:`.backbones`, :mod:`.heads`, :mod:`.model` (``shard_model``, ``predict_sharded``:
a built mmseg segmentor sharded) and :mod:`.infer` (one image measured, the library of
``tools/infer_highres.py --shard / --nproc``).

The names below depend on torch only."""

from .comm import exchange_rows, fetch_rows, gather_rows, row_offsets

from .bands import band_bounds, band_of, check_world_size
from .launch import free_port, init_from_env, run_parallel
from .circulant import ShardedCirculantAttention, circulant_comm_bytes
from .core import ShardedCoreAttention, core_comm_bytes
from .fft import sharded_irfft2, sharded_rfft2
from .banded import BandedMap
from . import handlers  # noqa: F401  (registers the BandedMap handlers)

__all__ = [
    'BandedMap',
    'band_bounds',
    'band_of',
    'check_world_size',
    'free_port',
    'init_from_env',
    'run_parallel',
    'ShardedCirculantAttention',
    'ShardedCoreAttention',
    'circulant_comm_bytes',
    'core_comm_bytes',
    'sharded_rfft2',
    'sharded_irfft2',
    'exchange_rows',
    'fetch_rows',
    'gather_rows',
    'row_offsets',
]
