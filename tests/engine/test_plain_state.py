"""mmcirc.engine.plain_state: what mmengine puts into a checkpoint, written in the types
torch's ``weights_only`` loader reads, and read back as the very objects."""

import collections
import pickle
import uuid

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub

from mmcirc.engine import from_plain, to_plain


def _hub_state():
    """A message hub's state as mmengine's Runner saves it (buffers, numpy info)."""
    hub = MessageHub.get_instance(f'plain-state-{uuid.uuid4()}')
    for i, loss in enumerate([1.5, 1.25, 0.75]):
        hub.update_scalar('train/loss', loss)
        hub.update_scalar('train/lr', 1e-3 * (i + 1))
    hub.update_scalar('val/count', 3, count=2)  # int history, counts other than 1
    hub.update_info('iter', 3)
    hub.update_info('mean', np.float32(0.25))
    hub.update_info('hist', np.arange(6, dtype=np.int16).reshape(2, 3))
    hub.update_info('names', np.array(['a', 'bc']))
    hub.update_info('pair', (np.int64(7), [np.bool_(True)]))
    return hub.state_dict()


def _same(a, b):
    """Equal values of the same types, numpy dtypes and shapes, all the way down."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, HistoryBuffer):
        assert a.max_length == b.max_length
        for x, y in zip(a.data, b.data):
            _same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def test_a_message_hub_round_trips_exactly_through_weights_only_torch_load(tmp_path):
    state = _hub_state()
    reference = pickle.loads(pickle.dumps(state))  # an independent copy of the original
    path = tmp_path / 'hub.pth'
    torch.save({'message_hub': to_plain(state)}, path)
    loaded = torch.load(path, weights_only=True)['message_hub']
    _same(from_plain(loaded), reference)


def test_the_original_is_left_unchanged():
    state = _hub_state()
    reference = pickle.loads(pickle.dumps(state))
    to_plain(state)
    _same(state, reference)


def test_plain_values_come_back_as_the_same_objects():
    weights = collections.OrderedDict(w=torch.ones(2))
    ckpt = {'state_dict': weights, 'meta': {'iter': 2, 'classes': ('a', 'b')}}
    assert to_plain(ckpt) is ckpt and from_plain(ckpt) is ckpt


def test_an_object_array_is_left_for_another_loader():
    array = np.array([object()], dtype=object)
    assert to_plain(array) is array


@pytest.mark.parametrize('dtype', ['>f8', 'uint64', 'complex64', 'bool'])
def test_other_numeric_dtypes_round_trip(dtype, tmp_path):
    array = np.arange(4).astype(dtype)
    torch.save(to_plain({'a': array}), tmp_path / 'a.pth')
    _same(from_plain(torch.load(tmp_path / 'a.pth', weights_only=True))['a'], array)


def test_an_unknown_record_is_an_error():
    with pytest.raises(ValueError, match='unknown __mmcirc_plain__ record'):
        from_plain({'__mmcirc_plain__': 'Nope'})
