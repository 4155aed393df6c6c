"""Atomic checkpoint saving and resuming from the newest checkpoint that loads."""

import os

import pytest
import torch
from mmengine.fileio import get_file_backend
from mmengine.hooks import checkpoint_hook
from mmengine.runner.checkpoint import save_checkpoint

from mmcirc.engine import AtomicLocalBackend, UnsafeCheckpointError, find_resumable_checkpoint

pytestmark = pytest.mark.usefixtures('safe_io')  # installed as a user opts in


def _save(path, step):
    torch.save({'meta': {'iter': step}, 'state_dict': {'w': torch.full((4,), float(step))}}, path)


def _corrupt(path, how):
    data = path.read_bytes()
    if how == 'truncated':
        path.write_bytes(data[: len(data) // 2])
    elif how == 'empty':
        path.write_bytes(b'')
    else:  # random bytes of the same length
        path.write_bytes(os.urandom(len(data)))


def test_mmengine_local_writes_go_through_the_atomic_backend(tmp_path):
    assert isinstance(get_file_backend(str(tmp_path / 'x.pth')), AtomicLocalBackend)


def test_failed_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / 'iter_2.pth'
    save_checkpoint({'meta': {'iter': 1}}, str(path))

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError('no space left on device')

    with pytest.raises(RuntimeError):
        save_checkpoint({'meta': {'iter': 2}, 'x': Unpicklable()}, str(path))
    assert torch.load(path)['meta']['iter'] == 1
    assert os.listdir(tmp_path) == ['iter_2.pth']


def test_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / 'iter_2.pth'
    save_checkpoint({'meta': {'iter': 1}}, str(path))
    real_fsync = os.fsync

    def full_disk(fd):  # the payload is written, then the disk refuses
        real_fsync(fd)
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(os, 'fsync', full_disk)
    with pytest.raises(OSError):
        save_checkpoint({'meta': {'iter': 2}}, str(path))
    monkeypatch.undo()
    assert torch.load(path)['meta']['iter'] == 1
    assert os.listdir(tmp_path) == ['iter_2.pth']


def test_checkpoint_hook_writes_its_pointer_atomically(tmp_path):
    with checkpoint_hook.open(tmp_path / 'last_checkpoint', 'w') as f:
        f.write(str(tmp_path / 'iter_1.pth'))
        assert not (tmp_path / 'last_checkpoint').exists()  # not visible before the end
    assert (tmp_path / 'last_checkpoint').read_text() == str(tmp_path / 'iter_1.pth')
    with checkpoint_hook.open(tmp_path / 'last_checkpoint') as f:  # reads unchanged
        assert f.read().endswith('iter_1.pth')


@pytest.mark.parametrize('how', ['truncated', 'empty', 'random'])
def test_resume_skips_a_broken_latest_checkpoint(tmp_path, how):
    for step in (2, 4, 6):
        _save(tmp_path / f'iter_{step}.pth', step)
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_6.pth'))
    _corrupt(tmp_path / 'iter_6.pth', how)
    path, skipped = find_resumable_checkpoint(str(tmp_path))
    assert path == str(tmp_path / 'iter_4.pth')
    assert [p for p, _ in skipped] == [str(tmp_path / 'iter_6.pth')]


def test_resume_follows_the_pointer_when_intact(tmp_path):
    for step in (2, 4):
        _save(tmp_path / f'iter_{step}.pth', step)
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_2.pth'))
    assert find_resumable_checkpoint(str(tmp_path)) == (str(tmp_path / 'iter_2.pth'), [])


def test_resume_with_an_empty_pointer_takes_the_newest_step(tmp_path):
    for step in (9, 10):  # numeric order, not text order
        _save(tmp_path / f'iter_{step}.pth', step)
    (tmp_path / 'last_checkpoint').write_text('')
    assert find_resumable_checkpoint(str(tmp_path)) == (str(tmp_path / 'iter_10.pth'), [])


def test_explicit_broken_checkpoint_falls_back_in_its_folder(tmp_path):
    _save(tmp_path / 'iter_2.pth', 2)
    _save(tmp_path / 'iter_4.pth', 4)
    _corrupt(tmp_path / 'iter_4.pth', 'truncated')
    path, skipped = find_resumable_checkpoint(str(tmp_path / 'other'), str(tmp_path / 'iter_4.pth'))
    assert path == str(tmp_path / 'iter_2.pth') and len(skipped) == 1


def test_no_intact_checkpoint_is_an_error_naming_each(tmp_path):
    _save(tmp_path / 'iter_2.pth', 2)
    _corrupt(tmp_path / 'iter_2.pth', 'empty')
    with pytest.raises(FileNotFoundError, match='no intact checkpoint.*iter_2.pth'):
        find_resumable_checkpoint(str(tmp_path))


def test_nothing_to_resume_from(tmp_path):
    assert find_resumable_checkpoint(str(tmp_path)) == (None, [])


def test_foreign_objects_are_not_skipped_silently(tmp_path):
    torch.save({'meta': UnsafeCheckpointError('x')}, tmp_path / 'iter_2.pth')
    with pytest.raises(UnsafeCheckpointError):
        find_resumable_checkpoint(str(tmp_path))
