"""What mmcirc's commands share: the one ``error:`` line (:mod:`mmcirc.cli_errors`), the
flags several commands take (``--cfg-options``, ``--allow-partial-weights``, the backbone
overrides) and the library's messages in their words.
"""

import argparse
import contextlib
import os
import os.path as osp
import pickle
import re
import sys
import warnings
from typing import Dict, Optional

from mmcirc.cli_errors import CLIError, error_line, main_guard, refusal_line  # noqa: F401


class _CfgOptions(argparse.Action):
    """mmengine's ``DictAction`` (values read as it reads them), an item without ``=``
    a usage error naming it."""

    def __call__(self, parser, namespace, values, option_string=None):
        from mmengine.config import DictAction

        for item in values:
            if '=' not in item or not item.split('=', 1)[0].strip():
                parser.error(f'{option_string}: {item!r} is not key=value')
        DictAction(self.option_strings, self.dest)(parser, namespace, values, option_string)


class Accumulate(argparse.Action):
    """A list flag given more than once: the values of every occurrence, in order (argparse's
    ``'extend'``, whose first occurrence replaces the default list instead of adding to it).
    Use with ``nargs='+'`` (or ``'*'``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        kept = getattr(namespace, self.dest, None)
        kept = [] if kept is None or kept is self.default else list(kept)
        setattr(namespace, self.dest, kept + list(values))


class Once(argparse.Action):
    """A flag of several values that make one thing (``--shape H W``): given twice, a
    usage error naming it, never the last occurrence silently."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not self.default:
            parser.error(f'{option_string} was given twice: give it once')
        setattr(namespace, self.dest, values)


def add_cfg_options(parser, example: str = ''):
    """``--cfg-options key=value ...``: the config's overrides, as mmengine's ``DictAction``
    reads them (checked by :func:`mmcirc.apis.builder.load_model_config`)."""
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=_CfgOptions,
        metavar='KEY=VALUE',
        help='override config settings, key=value' + (f' (e.g. {example})' if example else ''),
    )
    return parser


def check_config_file(path: str, checkpoint: Optional[str] = None) -> None:
    """A config file that exists and that mmengine reads
    (:func:`~mmcirc.apis.builder.check_config_path`) and the ``checkpoint`` file, when
    given, exists; else the error the commands print as one line."""
    from mmcirc.apis.builder import check_config_path

    check_config_path(path)
    if checkpoint is not None and not osp.isfile(checkpoint):
        raise CLIError(f'checkpoint file not found: {checkpoint}')


def check_output_dir(path: str, flag: str) -> None:
    """``path`` is a writable folder, or none yet under one (created when written); else
    a one-line :class:`CLIError` naming ``flag`` (a file in the way, no permission, a
    read-only file system)."""
    probe = osp.abspath(osp.expanduser(path))
    while not osp.lexists(probe) and osp.dirname(probe) != probe:
        probe = osp.dirname(probe)
    if not osp.isdir(probe):
        if probe == osp.abspath(osp.expanduser(path)):
            raise CLIError(f'{flag} {path} is a file, not a folder')
        raise CLIError(f'{flag} {path}: {probe} is a file, not a folder')
    if not os.access(probe, os.W_OK | os.X_OK):
        read_only = os.statvfs(probe).f_flag & os.ST_RDONLY
        why = 'Read-only file system' if read_only else 'Permission denied'
        raise CLIError(f'{flag} {path}: cannot write in {probe}: {why}')


def add_trust_flag(parser, what: str = 'CHECKPOINT'):
    """``--trust-checkpoint``: load ``what`` by full unpickling (:func:`trust_if_asked`)."""
    parser.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help=f'allow full unpickling of {what} (only for files you trust: it can run code)',
    )


def trust_if_asked(args) -> None:
    """``--trust-checkpoint`` given with a checkpoint: that file loads by full unpickling
    in this process (:func:`mmcirc.engine.trust_checkpoint`)."""
    if args.trust_checkpoint and args.checkpoint is not None:
        from mmcirc.engine import trust_checkpoint

        trust_checkpoint(args.checkpoint)


@contextlib.contextmanager
def refused_checkpoints(flag: str = '--trust-checkpoint'):
    """A checkpoint refused inside the block (``pickle.UnpicklingError``) becomes a
    one-line :class:`CLIError` naming ``flag`` (:func:`refusal_line`)."""
    try:
        yield
    except pickle.UnpicklingError as err:
        raise CLIError(refusal_line(err, flag)) from None


def check_device(device: str) -> None:
    """``--device``: 'cpu' or 'cuda[:N]' with CUDA available, else a one-line CLIError."""
    if not (device == 'cpu' or re.fullmatch(r'cuda(:\d+)?', device)):
        raise CLIError(f"--device must be 'cpu' or 'cuda[:N]', got {device!r}")
    if device.startswith('cuda'):
        import torch

        if not torch.cuda.is_available():
            raise CLIError(f'--device {device}: CUDA is not available here')


def show_or_warn(show: bool, saves: str) -> bool:
    """``--show`` where a window can open: matplotlib's backend (what mmengine's
    visualizers show with) is interactive. Where it is not (no display: Agg), the
    visualizers would wait ``--wait-time`` per image, forever at 0, and show nothing:
    False, with one warning line on stderr naming ``saves`` (the flag that saves the
    pictures); the run goes on."""
    if not show:
        return False
    import matplotlib

    backend = matplotlib.get_backend().lower()  # 'Agg' after matplotlib.use('Agg')
    try:  # matplotlib >= 3.9
        from matplotlib.backends import BackendFilter, backend_registry

        windows = backend_registry.list_builtin(BackendFilter.INTERACTIVE)
    except ImportError:
        from matplotlib import rcsetup

        windows = rcsetup.interactive_bk
    if backend in {b.lower() for b in windows}:
        return True
    print(
        f"WARNING: --show: matplotlib's backend {backend} opens no window (no display?); "
        f'nothing is shown ({saves} saves the pictures)',
        file=sys.stderr,
        flush=True,
    )
    return False


def add_partial_weights_flag(parser):
    """``--allow-partial-weights``: ``build_model(..., allow_partial_weights=True)``."""
    parser.add_argument(
        '--allow-partial-weights',
        action='store_true',
        help='load a checkpoint that leaves weights of the model missing or shaped '
        'otherwise (those stay random); without it such a checkpoint is refused',
    )


def add_compile_flag(parser, note: str = ''):
    """``--compile [BACKEND]`` (:mod:`mmcirc.engine.compile`); ``note`` ends its help."""
    parser.add_argument(
        '--compile',
        nargs='?',
        const='inductor',
        metavar='BACKEND',
        help='torch.compile the backbone and the neck, fullgraph, the heads eager '
        f"(BACKEND: torch.compile's, default inductor{note})",
    )


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
