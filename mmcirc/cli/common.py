"""What mmcirc's commands share: the one ``error:`` line (:class:`CLIError`,
:func:`main_guard`: exit 1, ``MMCIRC_DEBUG=1`` for the traceback), the flags several
commands take (``--cfg-options``, ``--allow-partial-weights``, the backbone overrides) and
the library's messages in their words. The library raises ``ValueError`` / ``TypeError``
(or its own exception types); the commands turn them into that one line.
"""

import argparse
import contextlib
import functools
import os
import os.path as osp
import pickle
import re
import sys
import warnings
from typing import Dict, Optional


class CLIError(Exception):
    """An error the tools report as one line (what and where), without a traceback."""


class _CfgOptions(argparse.Action):
    """mmengine's ``DictAction`` (values read as it reads them), an item without ``=``
    a usage error naming it."""

    def __call__(self, parser, namespace, values, option_string=None):
        from mmengine.config import DictAction

        for item in values:
            if '=' not in item or not item.split('=', 1)[0].strip():
                parser.error(f'{option_string}: {item!r} is not key=value')
        DictAction(self.option_strings, self.dest)(parser, namespace, values, option_string)


def add_cfg_options(parser, example: str = ''):
    """The commands' ``--cfg-options key=value ...`` (mmengine's ``DictAction``: the
    overrides of the config, as a dict; their values are checked against the config's
    when it is loaded, :func:`mmcirc.apis.builder.load_model_config`); ``example`` is
    added to its help."""
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=_CfgOptions,
        metavar='KEY=VALUE',
        help='override config settings, key=value' + (f' (e.g. {example})' if example else ''),
    )
    return parser


#: The config files mmengine's ``Config.fromfile`` reads.
CONFIG_EXTENSIONS = ('.py', '.json', '.yaml', '.yml')


def check_config_file(path: str, what: str = 'config') -> None:
    """A config file that exists and that mmengine reads (:data:`CONFIG_EXTENSIONS`),
    else a one-line ``CLIError``."""
    if not osp.isfile(path):
        raise CLIError(f'{what} file not found: {path}')
    if osp.splitext(path)[1].lower() not in CONFIG_EXTENSIONS:
        raise CLIError(
            f'{what} {path}: a config must be one of {", ".join(CONFIG_EXTENSIONS)} files'
        )


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


@contextlib.contextmanager
def refused_checkpoints(flag: str = '--trust-checkpoint'):
    """A checkpoint refused inside the block (``pickle.UnpicklingError``) becomes a
    one-line :class:`CLIError` naming ``flag`` (:func:`refusal_line`)."""
    try:
        yield
    except pickle.UnpicklingError as err:
        raise CLIError(refusal_line(err, flag)) from None


#: Set to 1 to see the traceback behind a tool's one-line ``error:``.
DEBUG_ENV = 'MMCIRC_DEBUG'


#: Keyword arguments of the library that its messages name, and the tools' flags for
#: them (every tool that loads weights through ``build_model`` has the flag).
KEYWORD_FLAGS = {'allow_partial_weights=True': '--allow-partial-weights'}


def error_line(err: BaseException) -> str:
    """The one line a tool prints for ``err``: its message's first line (a registry
    ``KeyError`` without mmengine's "Please check ..." advice; the library's keywords
    of :data:`KEYWORD_FLAGS` in flag words; a refused checkpoint: :func:`refusal_line`)."""
    if isinstance(err, pickle.UnpicklingError):
        return refusal_line(err)
    message = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    message = message.split('. Please check')[0].strip()
    for keyword, flag in KEYWORD_FLAGS.items():
        message = message.replace(keyword, flag)
    return message.splitlines()[0] if message else type(err).__name__


def check_device(device: str) -> None:
    """``--device``: 'cpu' or 'cuda[:N]' with CUDA available, else a one-line CLIError."""
    if not (device == 'cpu' or re.fullmatch(r'cuda(:\d+)?', device)):
        raise CLIError(f"--device must be 'cpu' or 'cuda[:N]', got {device!r}")
    if device.startswith('cuda'):
        import torch

        if not torch.cuda.is_available():
            raise CLIError(f'--device {device}: CUDA is not available here')


def add_partial_weights_flag(parser):
    """``--allow-partial-weights``: load a checkpoint that leaves weights of the model
    unset (``build_model(..., allow_partial_weights=True)``); refused without it."""
    parser.add_argument(
        '--allow-partial-weights',
        action='store_true',
        help='load a checkpoint that leaves weights of the model missing or shaped '
        'otherwise (those stay random); without it such a checkpoint is refused',
    )
    return parser


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


def add_override_args(parser):
    """The backbone override flags; :func:`overrides_from_args` reads them back."""
    parser.add_argument(
        '--num-cores',
        help="active cores C' of core stages (pyramids: int or mobile (8) / edge (32) / "
        'server (64); VECA: a multiple of 8 within its bank, or a preset)',
    )
    parser.add_argument(
        '--boundary', help="circulant boundary: 'circular' or 'zero' (pyramids, CA-DeiT)"
    )
    parser.add_argument(
        '--scale', help="circulant scale: 'sqrt_n' (official) or 'n' (paper, resolution invariant)"
    )
    parser.add_argument(
        '--stage-attentions',
        help="attention kind of every stage (a registered block's kind the backbone's "
        'family takes, e.g. circulant, core, sra) or one per stage, comma separated '
        '(pyramids)',
    )
    return parser


def overrides_from_args(args) -> Dict[str, object]:
    """The overrides of :func:`add_override_args`' flags, checked by
    :func:`mmcirc.apis.overrides.validate_overrides`."""
    from mmcirc.apis.overrides import OVERRIDE_KEYS, validate_overrides

    return validate_overrides(**{k: getattr(args, k, None) for k in OVERRIDE_KEYS})


def flag_words(message: str) -> str:
    """A library message that starts with an override's name (``num_cores must ...``)
    -> the same with its flag (``--num-cores must ...``)."""
    from mmcirc.apis.overrides import OVERRIDE_KEYS

    m = re.match(r'(\w+)\b', message)
    if m and m.group(1) in OVERRIDE_KEYS:
        return '--' + m.group(1).replace('_', '-') + message[m.end() :]
    return message


@contextlib.contextmanager
def as_cli_errors():
    """The library's ValueError / TypeError -> one-line :class:`CLIError` in flag words."""
    try:
        yield
    except (ValueError, TypeError) as err:
        raise CLIError(flag_words(error_line(err))) from None
