"""Safe checkpoint loading for mmengine on torch >= 2.6, and atomic checkpoint saving.

torch >= 2.6 unpickles with ``weights_only=True`` and mmengine 0.10 does not say which
types its checkpoints hold, so resuming fails; switching ``weights_only`` off would let
any downloaded checkpoint run code. :func:`install_safe_loader` keeps torch's safe
unpickler and allows exactly the types mmengine writes
(:data:`MMENGINE_CHECKPOINT_GLOBALS`), or a file the user trusts (:func:`trust_checkpoint`).
mmengine writes ``iter_N.pth`` and ``last_checkpoint`` in place, so a kill leaves a
truncated file that ``--resume`` picks up: :func:`install_atomic_saving` writes both
through :func:`mmcirc.utils.fileio.atomic_open`, the pointer after the checkpoint.
Importing mmcirc installs neither: a Runner opts in with :class:`SafeCheckpointIOHook`
(every config mmcirc ships does), other code calls the two functions (idempotent).
:func:`find_resumable_checkpoint` picks the newest checkpoint that loads.
"""

import builtins
import os
import os.path as osp
import pickle
import re
import warnings
from typing import List, Optional, Tuple

import numpy as np
import torch
from mmengine.fileio.backends import LocalBackend, register_backend
from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import HistoryBuffer
from mmengine.registry import HOOKS
from mmengine.runner.checkpoint import CheckpointLoader

from mmcirc.utils.fileio import atomic_open, atomic_write

from .plain_state import from_plain, to_plain


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
    if obj is HistoryBuffer and not name.startswith('_') and callable(vars(obj).get(name)):
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only HistoryBuffer statistics '
        'methods may be looked up'
    )


#: What mmengine puts into a checkpoint besides tensors and plain containers: the
#: message hub's metric buffers (and the lookup of their statistics methods) and numpy
#: arrays, scalars and dtypes.
MMENGINE_CHECKPOINT_GLOBALS = [
    HistoryBuffer,
    (_history_buffer_getattr, 'builtins.getattr'),
    *_numpy_globals(),
]

_trusted = set()


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint refused because unpickling it would call or build ``globals``
    (``module.name`` strings) outside mmengine's allowed types.

    Its message reads ``<path>: refused: it would run code (`posix.system`) ...``;
    ``path`` and ``globals`` are kept as attributes for callers that word their own.
    """

    def __init__(self, path, globals_=()):
        self.path, self.globals = str(path), list(globals_)
        names = ', '.join(self.globals)
        super().__init__(
            f'{self.path}: refused: it would run code (`{names}`): it holds pickled objects '
            'outside the types mmengine checkpoints use. Load it only if you trust its '
            "source: the loading command's --trust-checkpoint flag, or "
            'mmcirc.engine.trust_checkpoint(path) in Python'
        )

    def __reduce__(self):  # rebuilt from its arguments (multiprocessing, copies)
        return type(self), (self.path, self.globals)


class CheckpointReadError(pickle.UnpicklingError, ValueError):
    """A file that is not a readable checkpoint: ``cannot read <path>: <reason>``, the
    reason in words (:func:`unreadable_reason`: ``empty``, ``truncated ...``, ``not a
    checkpoint: text``, ...); ``path`` and ``reason`` are kept as attributes. A
    ``ValueError`` (and, as torch's unpickler raises, an ``UnpicklingError``)."""

    def __init__(self, path, reason):
        self.path, self.reason = str(path), str(reason)
        super().__init__(f'cannot read {self.path}: {self.reason}')

    def __reduce__(self):
        return type(self), (self.path, self.reason)


#: What torch.load raises for a file that is no checkpoint (empty, cut short, text),
#: besides UnpicklingError; but not what the system says of the file itself.
_UNREADABLE = (RuntimeError, EOFError, IndexError, KeyError, ValueError, AttributeError, OSError)
_NOT_THE_CONTENT = (PermissionError, FileNotFoundError, IsADirectoryError, MemoryError)
#: What torch and pickle say of a legacy checkpoint or pickle cut short.
_ENDS_EARLY = re.compile(r'Ran out of input|unexpected EOF|pickle data was truncated')


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError as err:  # a character cut at the end of the sample
        if err.start < len(head) - 3:
            return False
        text = head[: err.start].decode('utf-8')
    return bool(text) and all(c.isprintable() or c in '\t\n\r\f\v' for c in text)


def unreadable_reason(filename, err: BaseException) -> str:
    """Why ``filename`` did not load (``err``: what torch raised), in words read from
    the file itself: ``empty``, ``truncated`` (a zip checkpoint without its end record,
    or a pickle that ends early), ``not a checkpoint: text``, else ``not a torch
    checkpoint or damaged`` with the loader's own reason."""
    import zipfile

    size = osp.getsize(filename)
    if size == 0:
        return 'empty (0 bytes)'
    with open(filename, 'rb') as f:
        head = f.read(4096)
    if head.startswith(b'PK\x03\x04') and not zipfile.is_zipfile(filename):
        return f'truncated ({size} bytes: a zip checkpoint without its end record)'
    if head[:1] == b'\x80' and (isinstance(err, EOFError) or _ENDS_EARLY.search(str(err))):
        return f'truncated ({size} bytes: the pickle ends early)'
    if _looks_like_text(head):
        return 'not a checkpoint: text'
    why = _unpickler_reason(err) if isinstance(err, pickle.UnpicklingError) else _first_line(err)
    return f'not a torch checkpoint or damaged ({why[:200]})'


def trust_checkpoint(path):
    """Allow full (unsafe) unpickling of the file at ``path``, and only that file."""
    _trusted.add(osp.realpath(osp.expanduser(path)))


def load_from_local(filename, map_location):
    """Load a local checkpoint with torch's safe unpickler plus mmengine's types
    (mmengine's ``load_from_local``, under its name and signature: ``CheckpointLoader``
    looks the loader up by name); :class:`UnsafeCheckpointError` naming the globals of a
    file that needs more, unless it was passed to :func:`trust_checkpoint` (then unpickled
    in full, with a warning)."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    trusted = osp.realpath(filename) in _trusted
    if trusted:
        warnings.warn(
            f'unpickling trusted checkpoint {filename} without restrictions: '
            'it can run arbitrary code',
            stacklevel=2,
        )
    try:
        if trusted:
            return torch.load(filename, map_location=map_location, weights_only=False)
        with torch.serialization.safe_globals(MMENGINE_CHECKPOINT_GLOBALS):
            return torch.load(filename, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, *_UNREADABLE) as err:  # also empty, truncated, text files
        if isinstance(err, _NOT_THE_CONTENT):
            raise
        refused = not trusted and isinstance(err, pickle.UnpicklingError)
        names = _refused_globals(filename, err) if refused else []
        if names:
            raise UnsafeCheckpointError(filename, names) from None
        raise CheckpointReadError(filename, unreadable_reason(filename, err)) from None


def _refused_globals(filename, err):
    """What a refused file would call or build, as ``module.name`` strings: from the
    zip checkpoint's pickle (torch lists them), else from the unpickler's refusal
    (legacy checkpoints), else from a scan of the pickle that runs nothing (bare pickles);
    empty when the file is merely unreadable."""
    allowed = {
        g[1] if isinstance(g, tuple) else f'{g.__module__}.{g.__qualname__}'
        for g in MMENGINE_CHECKPOINT_GLOBALS
    }
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(filename)
    except Exception:  # not a zip checkpoint
        found = []
    found = [g for g in found if g not in allowed]
    if found:
        return found
    match = re.search(r'GLOBAL (\S+?)[ .,]*(?:was not|whose module|$)', str(err), re.M)
    if match:
        return [match.group(1)]
    match = re.search(r'checkpoint asks for (getattr\(.*?\))', str(err))
    if match:
        return [match.group(1)]
    library = ('torch.', 'collections.', 'numpy.')  # their own globals, torch's loader reads
    return [g for g in _pickle_globals(filename) if g not in allowed and not g.startswith(library)]


def _pickle_globals(filename):
    """The ``module.name`` globals the first pickle of ``filename`` refers to, read with
    :mod:`pickletools` (nothing is run); empty for a file that is no pickle."""
    import pickletools

    found, strings, memo = [], [], {}
    try:
        with open(filename, 'rb') as f:
            for op, arg, _ in pickletools.genops(f):
                if op.name == 'GLOBAL':
                    found.append(arg.replace(' ', '.'))
                elif op.name == 'STACK_GLOBAL' and len(strings) >= 2:
                    found.append(f'{strings[-2]}.{strings[-1]}')
                elif isinstance(arg, str) and 'UNICODE' in op.name:
                    strings.append(arg)
                elif op.name == 'MEMOIZE' and strings:
                    memo[len(memo)] = strings[-1]
                elif op.name in ('BINPUT', 'LONG_BINPUT', 'PUT') and strings:
                    memo[arg] = strings[-1]
                elif op.name in ('BINGET', 'LONG_BINGET', 'GET') and arg in memo:
                    strings.append(memo[arg])
    except Exception:  # noqa: BLE001 (not a pickle, or a damaged one: what was read)
        pass
    return list(dict.fromkeys(found))


def _unpickler_reason(err):
    """The unpickler's own sentence out of torch's long 'Weights only load failed'."""
    match = re.search(
        r'WeightsUnpickler error:\s*(.*?)\s*(?:\n\nCheck the documentation|$)', str(err), re.S
    )
    return ' '.join((match.group(1) if match else str(err).splitlines()[0]).split())


def install_safe_loader():
    """Make mmengine load local checkpoints through :func:`load_from_local`."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose writes are atomic (:mod:`mmcirc.utils.fileio`)."""

    def put(self, obj: bytes, filepath) -> None:
        atomic_write(filepath, obj)

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        atomic_write(filepath, obj, encoding=encoding)


def _open_for_checkpoint_hook(file, mode='r', *args, **kwargs):
    """``open`` as seen by mmengine's CheckpointHook: writes are atomic, reads unchanged."""
    if mode in ('w', 'wb') and not args:
        return atomic_open(file, mode, encoding=kwargs.get('encoding'))
    return builtins.open(file, mode, *args, **kwargs)


def install_atomic_saving():
    """Make every checkpoint mmengine saves to a local path atomic, and the
    ``last_checkpoint`` pointer move only after the checkpoint is in place."""
    from mmengine.fileio import io as mmengine_io
    from mmengine.hooks import checkpoint_hook

    register_backend('local', AtomicLocalBackend, force=True, prefixes='')
    for key, backend in list(mmengine_io.backend_instances.items()):
        if type(backend) is LocalBackend:  # cached before the swap
            del mmengine_io.backend_instances[key]
    checkpoint_hook.open = _open_for_checkpoint_hook


@HOOKS.register_module()  # mmengine's root: mmdet/mmseg/mmpretrain HOOKS find it there
class SafeCheckpointIOHook(Hook):
    """A Runner's checkpoints, safe and complete. In a config:
    ``default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))``.

    - ``before_run`` (before weights are initialised, loaded or resumed):
      :func:`install_safe_loader` and :func:`install_atomic_saving`.
    - ``before_train``: :func:`remove_interrupted_saves` in the checkpoint folders.
    - ``before_save_checkpoint`` / ``after_load_checkpoint``: the checkpoint in plain
      types and back (:mod:`mmcirc.engine.plain_state`), so that plain ``torch.load``,
      ``init_detector`` and the Inferencers load the file and resuming restores the
      message hub exactly.
    """

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        install_safe_loader()
        install_atomic_saving()

    def before_train(self, runner) -> None:
        if not is_main_process():
            return
        removed = []
        for folder in _checkpoint_folders(runner):
            removed += remove_interrupted_saves(folder)
        if removed:
            runner.logger.info(
                f'removed {len(removed)} temporary file(s) of interrupted checkpoint saves: '
                + ', '.join(removed)
            )

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for key in list(checkpoint):
            checkpoint[key] = to_plain(checkpoint[key])

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        for key in list(checkpoint):
            checkpoint[key] = from_plain(checkpoint[key])


#: ``.iter_4.pth.k2x9_a1b.tmp``, ``.last_checkpoint.q0w8e7r6.tmp``: what
#: :func:`mmcirc.utils.fileio.atomic_open` leaves of a checkpoint (or of the pointer to
#: it) when the process dies before the rename.
_INTERRUPTED_SAVE = re.compile(r'^\.(?:.+\.pth|last_checkpoint)\.[a-z0-9_]+\.tmp$')


def remove_interrupted_saves(folder: str) -> List[str]:
    """Remove the temporary files that killed checkpoint saves left in ``folder``;
    returns their paths. Complete checkpoints and other files are never touched."""
    if not osp.isdir(folder):
        return []
    removed = []
    for name in sorted(os.listdir(folder)):
        path = osp.join(folder, name)
        if _INTERRUPTED_SAVE.match(name) and osp.isfile(path) and not osp.islink(path):
            try:
                os.remove(path)
            except FileNotFoundError:  # another process removed it meanwhile
                continue
            removed.append(path)
    return removed


def _checkpoint_folders(runner) -> List[str]:
    """The local folders a Runner's checkpoints go to: its work_dir and, for a
    CheckpointHook with ``out_dir``, ``out_dir/<work_dir name>`` (mmengine's rule)."""
    folders = [runner.work_dir]
    for hook in runner.hooks:
        out_dir = getattr(hook, 'out_dir', None) if isinstance(hook, CheckpointHook) else None
        if isinstance(out_dir, str) and '://' not in out_dir:  # as given: joined later
            folders.append(osp.join(out_dir, osp.basename(osp.normpath(runner.work_dir))))
    return list(dict.fromkeys(folders))


_STEP_FILE = re.compile(r'^(epoch|iter)_(\d+)\.pth$')


def _first_line(err: BaseException) -> str:
    if isinstance(err, CheckpointReadError):
        return err.reason
    text = str(err).strip().splitlines()
    return f'{type(err).__name__}: {text[0] if text else ""}'.rstrip(': ')


def _step_checkpoints(folder: str) -> List[str]:
    """``epoch_N.pth`` / ``iter_N.pth`` in ``folder``, newest (largest N) first."""
    if not osp.isdir(folder):
        return []
    matches = (_STEP_FILE.match(name) for name in os.listdir(folder))
    found = sorted(((int(m[2]), m[1], m[0]) for m in matches if m), reverse=True)
    return [osp.join(folder, name) for _, _, name in found]


def _pointer_target(work_dir: str) -> Optional[str]:
    try:
        with open(osp.join(work_dir, 'last_checkpoint')) as f:
            target = f.read().strip()
    except OSError:
        return None
    return osp.join(work_dir, target) if target else None  # an absolute target as it is


def find_resumable_checkpoint(
    work_dir: str, checkpoint: Optional[str] = None
) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The checkpoint to resume from and the newer ones that did not load: ``(path or
    None, [(skipped path, one-line reason), ...])``; ``(None, [])`` when there is nothing
    to resume from (mmengine then starts from scratch).

    Candidates, first to last: ``checkpoint`` if given, else the file ``last_checkpoint``
    in ``work_dir`` points to; then every ``epoch_N.pth``/``iter_N.pth`` beside it, largest
    N first, each loaded (safely, :func:`load_from_local`) until one works. Raises
    ``FileNotFoundError`` when none loads (naming each and why), and
    :class:`UnsafeCheckpointError` for a candidate holding foreign pickled objects (not a
    broken file: the user decides whether to trust it).
    """
    first = osp.abspath(checkpoint) if checkpoint else _pointer_target(work_dir)
    folder = osp.dirname(first) if first else work_dir
    candidates = [first] if first else []
    candidates += [
        p for p in _step_checkpoints(folder) if not first or osp.abspath(p) != osp.abspath(first)
    ]
    skipped = []
    for path in candidates:
        if not osp.isfile(path):
            skipped.append((path, 'file not found'))
            continue
        try:
            load_from_local(path, map_location='cpu')
        except UnsafeCheckpointError:
            raise
        except Exception as err:  # truncated, empty, random bytes: torch says why
            skipped.append((path, _first_line(err)))
            continue
        return path, skipped
    if skipped:
        raise FileNotFoundError(
            'no intact checkpoint to resume from: '
            + '; '.join(f'{p} ({why})' for p, why in skipped)
        )
    return None, []
