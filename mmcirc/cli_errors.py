"""The one ``error:`` line of every command: :class:`CLIError`, :func:`error_line` and
:func:`main_guard`. The commands of ``mmcirc/cli`` (through :mod:`mmcirc.cli.common`) and
the benchmarks' command (:mod:`mmcirc.benchmark.command`, which ``mmcirc/cli`` sits above)
share it; the library imports none of it: it raises ``ValueError`` / ``TypeError`` (or its
own exception types), which the commands turn into that one line.
"""

import functools
import os
import pickle
import re
import sys
from typing import Optional


class CLIError(Exception):
    """An error the tools report as one line (what and where), without a traceback."""


def refusal_line(err: BaseException, flag: Optional[str] = None) -> str:
    """A checkpoint the safe loader did not load, in one line: refused
    (:class:`mmcirc.engine.UnsafeCheckpointError`: what it would run) naming the tool's
    own ``flag`` (None: a tool without one; the way to trust it from Python), else
    unreadable (its message without torch's ``weights_only`` advice)."""
    from mmcirc.engine import UnsafeCheckpointError

    if not isinstance(err, UnsafeCheckpointError):
        sentences = re.split(r'(?<=[.;])\s+', ' '.join(str(err).split()))
        kept = [s for s in sentences if not re.search(r'weights_only|trust', s, re.I)]
        return ' '.join(kept).rstrip(' .;') or type(err).__name__
    text = f'{err.path}: refused: it would run code (`{", ".join(err.globals)}`)'
    if flag is None:
        return f'{text}; a file you trust loads after mmcirc.engine.trust_checkpoint(path)'
    return f'{text}; if you trust this file, pass {flag}'


def error_line(err: BaseException) -> str:
    """The one line a tool prints for ``err``: its message's first line (a registry
    ``KeyError`` without mmengine's "Please check ..." advice; the library's
    ``allow_partial_weights=True`` as the tools' flag; a refused checkpoint:
    :func:`refusal_line`)."""
    if isinstance(err, pickle.UnpicklingError):
        return refusal_line(err)
    if isinstance(err, OSError) and err.strerror and type(err).__str__ is OSError.__str__:
        # the system's words without the errno and the repr of the path
        return f'{err.filename}: {err.strerror}' if err.filename else err.strerror
    message = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    message = message.split('. Please check')[0].strip()
    message = message.replace('allow_partial_weights=True', '--allow-partial-weights')
    return message.splitlines()[0] if message else type(err).__name__


def _debug() -> bool:
    return os.environ.get('MMCIRC_DEBUG', '') not in ('', '0')


def main_guard(func):
    """Run ``func``; print expected failures (bad arguments, files, config values, what
    the system refused: a full disk, a read-only folder; mmengine's "X is not in the
    mmdet::model registry" ``KeyError``) as one ``error:`` line and exit 1; Ctrl-C as
    ``error: interrupted`` and exit 130. ``MMCIRC_DEBUG=1`` lets them raise with their
    traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except KeyboardInterrupt:
            if _debug():
                raise
            print('error: interrupted', file=sys.stderr, flush=True)
            sys.exit(130)
        except (CLIError, OSError, pickle.UnpicklingError, ValueError, TypeError, KeyError) as err:
            registry = ' registry' in str(err.args[0] if err.args else '')
            if _debug() or (isinstance(err, KeyError) and not registry):
                raise
            print(f'error: {error_line(err)}', file=sys.stderr)
            sys.exit(1)

    return wrapper
