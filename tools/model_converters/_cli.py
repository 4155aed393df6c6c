"""What the converter CLIs share: the target-model options, a check that the inputs
exist before the slow imports, the conversion, failures as one ``error:`` line (exit 1)."""
import os.path as osp
import pickle
import sys


def add_target_args(parser):
    """Options every converter takes: the target's attention layout, extra target
    arguments, trust and verbosity. The attention kinds are those of the registered
    blocks that fit the target family (checked when the target is built, so that
    ``--help`` does not import the libraries)."""
    parser.add_argument('--attention', default='circulant', metavar='KIND',
                        help='attention of stages 1-2 (the paper layout): circulant (default), core, '
                             'or any registered block kind of the family')
    parser.add_argument('--stage-attentions', nargs='+', metavar='KIND',
                        help='per-stage attention instead: one kind for every stage or one per stage '
                             '(the registered block kinds of the family)')
    parser.add_argument('--backbone-options', nargs='+', metavar='KEY=VALUE',
                        help='extra target arguments, e.g. num_cores_max=32')
    parser.add_argument('--trust-checkpoint', action='store_true',
                        help='allow full unpickling of the sources (only for files you trust)')
    parser.add_argument('--verbose', action='store_true', help='list every key')


def run(family, args, paths, cadeit=False):
    """Convert with :func:`mmcirc.models.convert.run_cli`; return the exit code."""
    for path in paths:
        if path is not None and not osp.isfile(path):
            print(f'error: checkpoint not found: {path}', file=sys.stderr)
            return 1
    from mmcirc.models.convert import ConversionError, run_cli
    try:
        run_cli(family, args, cadeit=cadeit)
    except (ConversionError, FileNotFoundError, pickle.UnpicklingError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    return 0


def run_isotropic(kind, args, paths):
    """Convert an official CA-DeiT (``kind='deit'``) or VECA (``'veca'``) checkpoint with
    :func:`mmcirc.models.convert_isotropic.run_isotropic_cli`; return the exit code."""
    for path in paths:
        if path is not None and not osp.isfile(path):
            print(f'error: checkpoint not found: {path}', file=sys.stderr)
            return 1
    from mmcirc.models.convert import ConversionError
    from mmcirc.models.convert_isotropic import run_isotropic_cli
    try:
        run_isotropic_cli(kind, args)
    except (ConversionError, FileNotFoundError, pickle.UnpicklingError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 1
    return 0
