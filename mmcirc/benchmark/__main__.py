"""``python -m mmcirc.benchmark SUITE [ARGS]``: run one suite (see
:mod:`mmcirc.benchmark.suites`); ``SUITE --help`` lists its flags."""

import importlib
import sys

from .suites import SUITES

if __name__ == '__main__':
    if len(sys.argv) < 2 or sys.argv[1] not in SUITES:
        print(
            f'error: usage: python -m mmcirc.benchmark SUITE [ARGS], SUITE one of {SUITES}',
            file=sys.stderr,
        )
        sys.exit(1)
    importlib.import_module(f'mmcirc.benchmark.suites.{sys.argv[1]}').main(sys.argv[2:])
