"""Safe checkpoint loading for mmengine on torch >= 2.6.

torch >= 2.6 unpickles with ``weights_only=True`` by default and mmengine 0.10 calls
``torch.load`` without saying which types its own checkpoints contain, so resuming a
Runner checkpoint fails. Switching ``weights_only`` off would let any downloaded
checkpoint run code. Instead mmcirc replaces mmengine's local-file loader with one that
keeps torch's safe unpickler and allows exactly the extra types mmengine writes
(:data:`MMENGINE_CHECKPOINT_GLOBALS`). A file outside that set is refused, unless the
user marked that very file as trusted with :func:`trust_checkpoint`.
"""
import os.path as osp
import pickle
import re
import warnings

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader


def _numpy_globals():
    """numpy functions and classes that pickled arrays, scalars and dtypes refer to."""
    try:  # numpy >= 1.25 keeps them under numpy.core as well as numpy._core
        from numpy.core.multiarray import _reconstruct, scalar
    except ImportError:  # pragma: no cover
        from numpy._core.multiarray import _reconstruct, scalar
    dtype_classes = [type(np.dtype(t)) for t in np.typecodes['All'] if t not in 'Mm']
    dtype_classes += [type(np.dtype('datetime64[s]')), type(np.dtype('timedelta64[s]'))]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes]


def _history_buffer_getattr(obj, name):
    """Stand-in for ``builtins.getattr`` while unpickling.

    A pickled HistoryBuffer refers to its statistics methods as
    ``getattr(HistoryBuffer, 'mean')``; a general getattr would open the way from any
    allowed class to arbitrary code, so only that lookup is served.
    """
    if (obj is HistoryBuffer and not name.startswith('_')
            and callable(vars(HistoryBuffer).get(name))):
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only HistoryBuffer statistics '
        'methods may be looked up')


#: What mmengine puts into a checkpoint besides tensors and plain containers: the
#: message hub's metric buffers (and the lookup of their statistics methods) and numpy
#: arrays, scalars and dtypes.
MMENGINE_CHECKPOINT_GLOBALS = [HistoryBuffer, (_history_buffer_getattr, 'builtins.getattr'),
                               *_numpy_globals()]

_trusted = set()


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds pickled objects outside mmengine's allowed types."""


def trust_checkpoint(path):
    """Allow full (unsafe) unpickling of the file at ``path``, and only that file."""
    _trusted.add(osp.realpath(osp.expanduser(path)))


def load_from_local_safely(filename, map_location=None):
    """Load a local checkpoint with torch's safe unpickler plus mmengine's types.

    Raises :class:`UnsafeCheckpointError` naming the offending globals if the file needs
    anything else; a file passed to :func:`trust_checkpoint` is unpickled in full, with
    a warning.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    if osp.realpath(filename) in _trusted:
        warnings.warn(f'unpickling trusted checkpoint {filename} without restrictions: '
                      'it can run arbitrary code', stacklevel=2)
        return torch.load(filename, map_location=map_location, weights_only=False)
    try:
        with torch.serialization.safe_globals(MMENGINE_CHECKPOINT_GLOBALS):
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        try:
            extra = torch.serialization.get_unsafe_globals_in_checkpoint(filename)
        except Exception:  # pragma: no cover - unreadable file: report torch's error
            extra = []
        allowed = {g[1] if isinstance(g, tuple) else f'{g.__module__}.{g.__qualname__}'
                   for g in MMENGINE_CHECKPOINT_GLOBALS}
        extra = [g for g in extra if g not in allowed] or ['(see torch message)']
        raise UnsafeCheckpointError(
            f'refusing to load {filename}: it contains pickled objects outside the types '
            f'mmengine checkpoints use: {", ".join(extra)}. Loading it could run arbitrary '
            'code. If you trust this file, pass --trust-checkpoint to tools/test.py or call '
            f'mmcirc.engine.trust_checkpoint(path) first. ({_unpickler_reason(err)})'
        ) from None


def _unpickler_reason(err):
    """The unpickler's own sentence out of torch's long 'Weights only load failed'."""
    match = re.search(r'WeightsUnpickler error:\s*(.*?)\s*(?:\n\nCheck the documentation|$)',
                      str(err), re.S)
    return ' '.join((match.group(1) if match else str(err).splitlines()[0]).split())


def install_safe_loader():
    """Make mmengine load local checkpoints through :func:`load_from_local_safely`."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local_safely, force=True)
