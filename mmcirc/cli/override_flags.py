"""The backbone override flags of the tools (``--num-cores``, ``--boundary``, ``--scale``,
``--stage-attentions``) and their values read back, checked by the library's one
validator (:func:`mmcirc.apis.overrides.validate_overrides`)."""

from typing import Dict

from mmcirc.apis.overrides import OVERRIDE_KEYS, validate_overrides

__all__ = ['add_override_args', 'overrides_from_args']


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
