"""What mmcirc's commands share: the one ``error:`` line (:class:`CLIError`,
:func:`main_guard`: exit 1, ``MMCIRC_DEBUG=1`` for the traceback), the size flags
(:func:`parse_hw`), ``--cfg-options`` (:func:`add_cfg_options`) and warnings as one line
(:func:`one_line_warnings`). The library raises
``ValueError`` / ``TypeError`` (or its own exception types); the commands turn them into
that one line.
"""

import functools
import os
import pickle
import sys
import warnings


class CLIError(Exception):
    """An error the tools report as one line (what and where), without a traceback."""


def parse_hw(text: str, flag: str, multiple: int = 1):
    """A size flag's value, ``S`` (square) or ``HxW``, as (H, W): both >= ``multiple`` and
    multiples of it; anything else is a one-line ``CLIError`` naming ``flag``."""
    try:
        hw = tuple(int(p) for p in str(text).lower().split('x'))
    except ValueError:
        hw = ()
    if len(hw) == 1:
        hw = hw * 2
    if len(hw) != 2 or any(s < multiple or s % multiple for s in hw):
        raise CLIError(
            f'{flag}: each size must be S or HxW with multiples of {multiple} '
            f'(>= {multiple}), got {text!r}'
        )
    return hw


def check_stride_sizes(sizes, flag: str = '--sizes', stride: int = 32) -> None:
    """Square input sides given to a backbone benchmark: positive multiples of the
    backbones' total ``stride``; anything else is a one-line ``CLIError`` naming ``flag``."""
    bad = [s for s in sizes if s < stride or s % stride]
    if bad:
        raise CLIError(f'{flag} must be multiples of {stride} (the total stride), got {bad}')


def add_cfg_options(parser, example: str = ''):
    """The commands' ``--cfg-options key=value ...`` (mmengine's ``DictAction``: the
    overrides of the config, as a dict); ``example`` is added to its help."""
    from mmengine.config import DictAction

    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value' + (f' (e.g. {example})' if example else ''),
    )
    return parser


#: Set to 1 to see the traceback behind a tool's one-line ``error:``.
DEBUG_ENV = 'MMCIRC_DEBUG'


def error_line(err: BaseException) -> str:
    """The one line a tool prints for ``err``: its message's first line (a registry
    ``KeyError`` without mmengine's "Please check ..." advice)."""
    message = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    message = message.split('. Please check')[0].strip()
    return message.splitlines()[0] if message else type(err).__name__


def main_guard(func):
    """Run ``func``; print expected failures (bad arguments, files, config values) as one
    ``error:`` line and exit 1. ``MMCIRC_DEBUG=1`` lets them raise with their traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (CLIError, FileNotFoundError, pickle.UnpicklingError, ValueError, TypeError) as err:
            if os.environ.get(DEBUG_ENV, '') not in ('', '0'):
                raise
            print(f'error: {error_line(err)}', file=sys.stderr)
            sys.exit(1)
        except KeyError as err:  # mmengine: "X is not in the mmdet::model registry ..."
            message = str(err.args[0]) if err.args else ''
            if ' registry' not in message or os.environ.get(DEBUG_ENV, '') not in ('', '0'):
                raise
            print(f'error: {error_line(err)}', file=sys.stderr)
            sys.exit(1)

    return wrapper


def one_line_warnings(*noise, category=None, wording=str):
    """Print warnings as one line, ``WARNING: <wording(message)>`` on stderr, without the
    libraries' deprecation noise, warnings of ``category`` and those whose message holds
    any of ``noise``."""
    warnings.filterwarnings('ignore', category=DeprecationWarning)
    warnings.filterwarnings('ignore', message='.*pkg_resources.*')
    if category is not None:
        warnings.filterwarnings('ignore', category=category)
    for text in noise:
        warnings.filterwarnings('ignore', message=f'.*{text}.*')

    def show(message, category, filename, lineno, file=None, line=None):
        print(f'WARNING: {wording(str(message))}', file=sys.stderr, flush=True)

    warnings.showwarning = show
