"""``python -m mmcirc.benchmark SUITE [ARGS]``: run one benchmark suite's command
(``mmcirc.cli.benchmark_<SUITE>``, over :mod:`mmcirc.benchmark.suites`); ``SUITE --help``
lists its flags. ``python -m mmcirc.benchmark docs [ARGS]`` runs the suites of the
documentation's tables and rewrites them (:mod:`mmcirc.cli.benchmark_docs`)."""

import importlib
import sys

from mmcirc.benchmark.suites import SUITES

COMMANDS = SUITES + ('docs',)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        print(
            f'error: usage: python -m mmcirc.benchmark SUITE [ARGS], SUITE one of {COMMANDS}',
            file=sys.stderr,
        )
        sys.exit(1)
    return importlib.import_module(f'mmcirc.cli.benchmark_{argv[0]}').main(argv[1:])
