"""Atomic writes: the target holds the old content or the new, never a part."""

import os

import pytest

from mmcirc.utils.fileio import atomic_open, atomic_write, atomic_write_many


def test_atomic_write_replaces_content(tmp_path):
    path = tmp_path / 'sub' / 'f.bin'
    atomic_write(path, b'old')
    atomic_write(path, 'new text')
    assert path.read_bytes() == b'new text'
    assert os.listdir(path.parent) == ['f.bin']


def test_failure_inside_the_block_keeps_the_old_file(tmp_path):
    path = tmp_path / 'f.txt'
    path.write_text('old')
    with pytest.raises(RuntimeError):
        with atomic_open(path, 'w') as f:
            f.write('half of the ne')
            raise RuntimeError('disk full')
    assert path.read_text() == 'old'
    assert os.listdir(tmp_path) == ['f.txt']


def test_permissions_follow_the_umask(tmp_path):
    mask = os.umask(0o022)
    try:
        atomic_write(tmp_path / 'f', b'x')
    finally:
        os.umask(mask)
    assert (tmp_path / 'f').stat().st_mode & 0o777 == 0o644


def test_many_files_all_or_nothing(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_many({tmp_path / 'a': b'1', tmp_path / 'b': object()})
    assert os.listdir(tmp_path) == []
    atomic_write_many({tmp_path / 'a': b'1', tmp_path / 'b': 'two'})
    assert (tmp_path / 'a').read_bytes() == b'1' and (tmp_path / 'b').read_text() == 'two'


@pytest.mark.parametrize('bad', [dict(mode='a'), dict(mode='r')])
def test_bad_mode_is_named(tmp_path, bad):
    with pytest.raises(ValueError, match="mode must be 'w' or 'wb'"):
        with atomic_open(tmp_path / 'f', **bad):
            pass


@pytest.fixture
def full_disk(monkeypatch):
    """Every temporary file's writes go to /dev/full (ENOSPC, as on a full disk); the
    temporary file itself is made, so that its removal shows."""
    import tempfile

    if not os.path.exists('/dev/full'):
        pytest.skip('no /dev/full here')
    mkstemp = tempfile.mkstemp

    def to_full(*args, **kwargs):
        fd, path = mkstemp(*args, **kwargs)
        os.close(fd)
        return os.open('/dev/full', os.O_WRONLY), path

    monkeypatch.setattr(tempfile, 'mkstemp', to_full)


@pytest.mark.parametrize('write', ['one', 'many'])
def test_a_full_disk_names_the_target_and_leaves_nothing(tmp_path, full_disk, write):
    target = tmp_path / 'out.png'
    with pytest.raises(OSError) as err:
        if write == 'one':
            atomic_write(target, b'x' * 100_000)
        else:
            atomic_write_many({target: b'x' * 100_000, tmp_path / 'out.json': '{}'})
    assert str(err.value) == f'cannot write {target}: No space left on device'
    assert os.listdir(tmp_path) == []


def test_a_file_in_the_way_of_the_folder_names_the_target(tmp_path):
    (tmp_path / 'f').write_text('a file')
    with pytest.raises(OSError) as err:
        atomic_write(tmp_path / 'f' / 'out.json', '{}')
    assert (
        str(err.value)
        == f'cannot write {tmp_path}/f/out.json: {tmp_path}/f is a file, not a folder'
    )
