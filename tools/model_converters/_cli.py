"""What the converter CLIs share: check the inputs exist before the slow imports, run
the conversion, print failures as one ``error:`` line (exit 1)."""
import os.path as osp
import pickle
import sys


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
