"""Atomic file writes: the one helper mmcirc uses whenever it writes a result file.

A file written in place can be left half written by a kill, a crash or a full disk,
and a reader (``--resume``, a metric parser) then picks up garbage. Everything here
writes to a temporary file in the target's folder, flushes and fsyncs it, and renames
it over the target (``os.replace``: atomic on POSIX within one file system), then
fsyncs the folder so the rename itself survives a power cut. A reader sees the old
file or the new one, never a mix; on failure the temporary file is removed, and a write
the system refused (a full disk, a read-only or forbidden folder) is a
:class:`WriteError`: ``cannot write PATH: No space left on device``, PATH the target.
"""

import contextlib
import errno
import os
import os.path as osp
import tempfile
from typing import Dict, Union

__all__ = ['WriteError', 'atomic_open', 'atomic_write', 'atomic_write_many', 'discard']


class WriteError(OSError):
    """A file the system did not let us write (``errno``, ``strerror`` of the failing
    call; ``filename`` the target, not its temporary file): ``cannot write PATH: why``."""

    def __str__(self):
        return f'cannot write {self.filename}: {self.strerror}'


def _make_folder(folder: str, path: str) -> None:
    """``os.makedirs(folder)``; a file in the way is a :class:`WriteError` naming it."""
    try:
        os.makedirs(folder, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = folder
        while not osp.lexists(blocking) and osp.dirname(blocking) != blocking:
            blocking = osp.dirname(blocking)
        raise WriteError(errno.ENOTDIR, f'{blocking} is a file, not a folder', path) from None


def _write_error(err: OSError, path: str) -> OSError:
    """``err`` of a write towards ``path`` as a :class:`WriteError` naming ``path``
    (errors without an errno, and WriteErrors, as they are)."""
    if isinstance(err, WriteError) or err.errno is None:
        return err
    return WriteError(err.errno, err.strerror or os.strerror(err.errno), path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):  # folders that cannot be opened (some FUSE mounts)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def discard(tmp: str) -> None:
    """Remove the file ``tmp`` if it can be (a temporary file given up)."""
    with contextlib.suppress(OSError):
        os.remove(tmp)


@contextlib.contextmanager
def atomic_open(path: Union[str, os.PathLike], mode: str = 'wb', encoding=None):
    """``with atomic_open(path, 'w') as f: ...`` writes ``path`` all at once or not at all.

    ``mode`` is ``'w'`` or ``'wb'``. The file appears at ``path`` (with the permissions
    ``open`` would give) only when the block ends without an exception.
    """
    if mode not in ('w', 'wb'):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = osp.abspath(osp.expanduser(os.fspath(path)))
    folder = osp.dirname(path)
    try:
        _make_folder(folder, path)
        fd, tmp = tempfile.mkstemp(prefix='.' + osp.basename(path) + '.', suffix='.tmp', dir=folder)
    except OSError as err:
        raise _write_error(err, path) from err
    try:
        with os.fdopen(fd, mode, encoding=encoding if mode == 'w' else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would
        os.replace(tmp, path)
    except BaseException as err:
        discard(tmp)
        if isinstance(err, OSError):
            raise _write_error(err, path) from err
        raise
    _fsync_dir(folder)


def atomic_write(path: Union[str, os.PathLike], data: Union[bytes, str], encoding='utf-8') -> None:
    """Write ``data`` (bytes, or text in ``encoding``) to ``path`` atomically."""
    if isinstance(data, str):
        data = data.encode(encoding)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f'atomic_write: data must be bytes or str, got {type(data).__name__}')
    with atomic_open(path, 'wb') as f:
        f.write(data)


def atomic_write_many(files: Dict[str, Union[bytes, str]]) -> None:
    """Write several files, each atomically, all or nothing as far as the file system
    allows: every payload goes to its temporary file first, then all are renamed in the
    given order (put an index or JSON file last). On a failure before the renames no
    target is touched and every temporary file is removed."""
    staged, path = [], None
    try:
        for path, data in files.items():
            if isinstance(data, str):
                data = data.encode('utf-8')
            path = osp.abspath(osp.expanduser(os.fspath(path)))
            _make_folder(osp.dirname(path), path)
            fd, tmp = tempfile.mkstemp(
                prefix='.' + osp.basename(path) + '.', suffix='.tmp', dir=osp.dirname(path)
            )
            staged.append((tmp, path))
            with os.fdopen(fd, 'wb') as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException as err:
        for tmp, _ in staged:
            discard(tmp)
        if isinstance(err, OSError):
            raise _write_error(err, path) from err
        raise
    for folder in {osp.dirname(path) for _, path in staged}:
        _fsync_dir(folder)
