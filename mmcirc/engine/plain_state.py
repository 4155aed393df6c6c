"""A Runner checkpoint in the types torch's ``weights_only`` loader reads, and back.

mmengine's message hub puts :class:`~mmengine.logging.HistoryBuffer` objects holding
numpy arrays, and numpy scalars, into every checkpoint, which ``torch.load`` with
``weights_only=True`` (and with it ``init_detector`` and the Inferencers) refuses.
:func:`to_plain` writes each such object as a small dict of tensors and Python values
tagged with :data:`TAG`; :func:`from_plain` turns the tags back into the very objects
(:class:`~mmcirc.engine.SafeCheckpointIOHook` calls them). A checkpoint without tags
(stock mmdet, mmseg) passes :func:`from_plain` unchanged.
"""

from collections import OrderedDict

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

__all__ = ['TAG', 'from_plain', 'to_plain']

#: The key that marks a dict written by :func:`to_plain`; its value names the type.
TAG = '__mmcirc_plain__'

_TENSOR_KINDS = 'biufc'  # bool, int, uint, float, complex: numpy dtypes torch holds
_TEXT_KINDS = 'US'  # str_, bytes_: kept as lists of Python str / bytes


def _array_to_plain(array):
    if array.dtype.kind in _TENSOR_KINDS and array.dtype.isnative:
        try:
            # copy(order='C'), not ascontiguousarray: that one makes a 0-d array 1-d
            return {TAG: 'ndarray', 'data': torch.from_numpy(array.copy(order='C'))}
        except TypeError:  # a numpy dtype this torch has no tensor type for
            pass
    if array.dtype.kind in _TENSOR_KINDS + _TEXT_KINDS:
        return {TAG: 'ndarray', 'list': array.tolist(), 'dtype': array.dtype.str}
    return array  # objects, datetimes: left for a loader that accepts them


def _array_from_plain(record):
    if 'data' in record:
        return record['data'].numpy().copy()
    return np.array(record['list'], dtype=np.dtype(record['dtype']))


def to_plain(obj):
    """``obj`` with every HistoryBuffer, numpy array and numpy scalar written as a
    tagged dict (tensors and Python values), inside dicts, OrderedDicts, lists and
    tuples. Containers are rebuilt only where something changed; ``obj`` itself is
    never modified."""
    if type(obj) is HistoryBuffer:
        log, count = obj.data
        return {
            TAG: 'HistoryBuffer',
            'log_history': _array_to_plain(log),
            'count_history': _array_to_plain(count),
            'max_length': obj.max_length,
        }
    if isinstance(obj, np.ndarray) and type(obj) is np.ndarray:
        return _array_to_plain(obj)
    if isinstance(obj, np.generic):
        plain = _array_to_plain(np.asarray(obj))
        if isinstance(plain, dict):
            plain[TAG] = 'numpy_scalar'
            return plain
        return obj
    return _map_containers(obj, to_plain)


def from_plain(obj):
    """The inverse of :func:`to_plain`: tagged dicts become the objects they stand for;
    everything else is returned as it is (containers rebuilt only where something
    changed)."""
    if type(obj) is dict and isinstance(obj.get(TAG), str):
        kind = obj[TAG]
        if kind == 'HistoryBuffer':
            return HistoryBuffer(
                _array_from_plain(obj['log_history']),
                _array_from_plain(obj['count_history']),
                max_length=obj['max_length'],
            )
        if kind == 'ndarray':
            return _array_from_plain(obj)
        if kind == 'numpy_scalar':
            return _array_from_plain(obj)[()]
        raise ValueError(f'checkpoint: unknown {TAG} record {kind!r}')
    return _map_containers(obj, from_plain)


def _map_containers(obj, fn):
    if type(obj) in (dict, OrderedDict):
        items = [(k, fn(v)) for k, v in obj.items()]
        if all(new is obj[k] for k, new in items):
            return obj
        return type(obj)(items)
    if type(obj) in (list, tuple):
        values = [fn(v) for v in obj]
        if all(new is old for new, old in zip(values, obj)):
            return obj
        return type(obj)(values)
    return obj
