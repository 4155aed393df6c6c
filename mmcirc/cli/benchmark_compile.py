"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.compile`
(``tools/analysis/benchmark_compile.py``, ``python -m mmcirc.benchmark compile``):
its flags, their checks, the one ``error:`` line and exit 1; the suite measures and writes."""

import argparse
import os.path as osp
import sys

from mmcirc.benchmark.suites import compile as suite
from mmcirc.cli.common import CLIError, main_guard, parse_hw

TOOL = 'tools/analysis/benchmark_compile.py'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=suite.__doc__.splitlines()[0])
    p.add_argument(
        '--models',
        nargs='+',
        default=list(suite.MODELS),
        metavar='MODEL',
        help=f'from {list(suite.MODELS)}',
    )
    p.add_argument('--sizes', nargs='+', default=suite.DEFAULT_SIZES, metavar='S|HxW')
    p.add_argument(
        '--backend', default='inductor', help=f'torch.compile backend, one of {suite.BACKENDS}'
    )
    p.add_argument('--mode', default='default', help=f'torch.compile mode, one of {suite.MODES}')
    p.add_argument('--repeat', type=int, default=5, help='timed calls of each, alternating')
    p.add_argument(
        '--threads', type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_compile'))
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in suite.MODELS]
    if unknown:
        raise CLIError(f'--models: unknown {unknown}; choose from {list(suite.MODELS)}')
    if args.backend not in suite.BACKENDS:
        raise CLIError(f'--backend must be one of {suite.BACKENDS}, got {args.backend!r}')
    if args.mode not in suite.MODES:
        raise CLIError(f'--mode must be one of {suite.MODES}, got {args.mode!r}')
    for opt in ('repeat', 'threads'):
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise CLIError(f'--{opt} must be a positive int, got {value}')
    args.sizes = [parse_hw(s, '--sizes', suite.MULTIPLE) for s in args.sizes]
    return args


@main_guard
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return suite.run(args, f'python {TOOL} ' + ' '.join(argv))
