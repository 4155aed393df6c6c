"""Safe checkpoint loading: mmengine's own types load, anything else is refused."""

import collections
import inspect
import pickle
import warnings

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint

from mmcirc.engine import UnsafeCheckpointError, load_from_local, trust_checkpoint


class Payload:
    """Stands for an arbitrary pickled object a downloaded checkpoint could carry."""

    def __init__(self):
        self.value = 3


def _runner_like_checkpoint():
    buf = HistoryBuffer()
    buf.update(0.5)
    buf.update(0.25)
    return {
        'meta': {
            'epoch': 1,
            'iter': 2,
            'seed': np.int64(7),
            'dtype': np.dtype('float32'),
            'hist': np.arange(4, dtype=np.int64),
        },
        'state_dict': collections.OrderedDict(w=torch.ones(2)),
        'message_hub': {
            'log_scalars': {'train/loss': buf},
            'runtime_info': {'lr': np.float64(0.1)},
        },
    }


def test_mmengine_types_load(tmp_path):
    path = tmp_path / 'ok.pth'
    torch.save(_runner_like_checkpoint(), path)
    ckpt = load_from_local(str(path), map_location=None)
    assert ckpt['meta']['seed'] == 7 and ckpt['meta']['dtype'] == np.dtype('float32')
    assert ckpt['message_hub']['log_scalars']['train/loss'].mean() == pytest.approx(0.375)
    assert torch.equal(ckpt['state_dict']['w'], torch.ones(2))


def test_mmengine_uses_the_safe_loader(tmp_path, safe_io):
    assert CheckpointLoader._get_checkpoint_loader('/any/local.pth') is load_from_local
    path = tmp_path / 'ok.pth'
    torch.save(_runner_like_checkpoint(), path)
    assert _load_checkpoint(str(path))['meta']['iter'] == 2


@pytest.mark.parametrize(
    'filename', ['/any/local.pth', 'rel/x.pth', ' s3://x/y.pth', 'ss3://x/y.pth']
)
def test_local_loader_keeps_mmengine_name_and_signature(filename, safe_io):
    """mmengine looks its loaders up by name (its own loader test does): the one that
    serves local paths once installed is named and called like mmengine's original
    ``load_from_local`` (still the module attribute, never re-bound)."""
    original = mmengine_checkpoint.load_from_local
    loader = CheckpointLoader._get_checkpoint_loader(filename)
    assert loader is not original
    assert loader.__name__ == original.__name__ == 'load_from_local'
    assert inspect.signature(loader) == inspect.signature(original)


def test_local_loader_behaves_like_mmengine_on_a_plain_checkpoint(tmp_path, safe_io):
    path = tmp_path / 'plain.pth'
    torch.save({'state_dict': collections.OrderedDict(w=torch.arange(6.0).view(2, 3))}, path)
    ours = CheckpointLoader.load_checkpoint(str(path), map_location='cpu')
    theirs = mmengine_checkpoint.load_from_local(str(path), map_location='cpu')
    assert ours.keys() == theirs.keys() and ours['state_dict'].keys() == {'w'}
    assert torch.equal(ours['state_dict']['w'], theirs['state_dict']['w'])
    for loader in (
        CheckpointLoader._get_checkpoint_loader(str(path)),
        mmengine_checkpoint.load_from_local,
    ):
        with pytest.raises(FileNotFoundError, match='can not be found'):
            loader(str(tmp_path / 'missing.pth'), None)


def test_foreign_object_is_refused(tmp_path):
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'payload': Payload()}, path)
    with pytest.raises(UnsafeCheckpointError, match='Payload'):
        load_from_local(str(path), map_location=None)


def test_trusted_file_loads_with_warning(tmp_path):
    path = tmp_path / 'trusted.pth'
    torch.save({'payload': Payload()}, path)
    trust_checkpoint(str(path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        ckpt = load_from_local(str(path), map_location=None)
    assert ckpt['payload'].value == 3
    assert any('trusted' in str(w.message) for w in caught)


def test_trust_is_per_file(tmp_path):
    trusted, other = tmp_path / 'a.pth', tmp_path / 'b.pth'
    torch.save({'payload': Payload()}, trusted)
    torch.save({'payload': Payload()}, other)
    trust_checkpoint(str(trusted))
    with pytest.raises(UnsafeCheckpointError):
        load_from_local(str(other), map_location=None)


class _GetattrPayload:
    """Pickles as getattr(HistoryBuffer, '__init__'): a lookup a checkpoint must not do."""

    def __reduce__(self):
        return getattr, (HistoryBuffer, '__init__')


def test_statistics_method_lookup_loads(tmp_path):
    path = tmp_path / 'stat.pth'
    torch.save({'f': HistoryBuffer.mean}, path)
    assert load_from_local(str(path), map_location=None)['f'] is HistoryBuffer.mean


def test_getattr_is_limited_to_history_buffer_methods(tmp_path):
    path = tmp_path / 'getattr.pth'
    torch.save({'f': _GetattrPayload()}, path)
    with pytest.raises(pickle.UnpicklingError, match='__init__'):
        load_from_local(str(path), map_location=None)


class _RunsCode:
    """Pickles as a call of ``posix.system``: what a malicious checkpoint carries."""

    def __reduce__(self):
        import os

        return os.system, ('echo never-run',)


@pytest.mark.parametrize('layout', ['zip', 'legacy', 'bare-pickle'])
def test_a_refused_checkpoint_names_the_global_it_would_call(tmp_path, layout):
    path = tmp_path / 'evil.pth'
    payload = {'state_dict': {}, 'x': _RunsCode()}
    if layout == 'zip':
        torch.save(payload, path)
    elif layout == 'legacy':
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps(payload))
    with pytest.raises(UnsafeCheckpointError) as err:
        load_from_local(str(path), map_location=None)
    assert 'refused: it would run code (`posix.system`)' in str(err.value)
    assert 'damaged' not in str(err.value) and err.value.globals == ['posix.system']


def test_a_damaged_file_still_says_damaged(tmp_path):
    path = tmp_path / 'random.pth'
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(pickle.UnpicklingError, match='not a torch checkpoint or damaged') as err:
        load_from_local(str(path), map_location=None)
    assert not isinstance(err.value, UnsafeCheckpointError)
