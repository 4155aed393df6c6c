"""The backbone override flags of the tools (``--num-cores``, ``--boundary``, ``--scale``,
``--stage-attentions``), their values read back, checked by the library's one
validator (:func:`mmcirc.apis.overrides.validate_overrides`), and the library's
messages about them in flag words (:func:`as_cli_errors`)."""

import contextlib
import re
from typing import Dict

from mmcirc.apis.overrides import OVERRIDE_KEYS, validate_overrides
from mmcirc.cli.common import CLIError, error_line

__all__ = ['add_override_args', 'as_cli_errors', 'flag_words', 'overrides_from_args']


def add_override_args(parser):
    """The override flags of the tools (``--num-cores``, ``--boundary``, ``--scale``,
    ``--stage-attentions``); :func:`overrides_from_args` reads them back."""
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
    """The validated overrides of :func:`add_override_args`' flags (ValueError as in
    :func:`mmcirc.apis.overrides.validate_overrides`)."""
    return validate_overrides(**{k: getattr(args, k, None) for k in OVERRIDE_KEYS})


def flag_words(message: str) -> str:
    """A library message that starts with an override's name (``num_cores must ...``,
    ``boundary has no effect ...``) -> the same with its flag (``--num-cores must ...``)."""
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
