"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.compile_train`
(``tools/analysis/benchmark_compile_train.py``, ``python -m mmcirc.benchmark
compile_train``): its flags, their checks, the one ``error:`` line and exit 1; the suite
measures and writes."""

import argparse
import os.path as osp
import sys

from mmcirc.benchmark.suites import compile_train as suite
from mmcirc.cli.common import CLIError, main_guard

TOOL = 'tools/analysis/benchmark_compile_train.py'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=suite.__doc__.splitlines()[0])
    p.add_argument(
        '--jobs',
        nargs='+',
        default=['det', 'seg'],
        metavar='JOB',
        help=f'from {list(suite.JOBS)} (default: det seg)',
    )
    p.add_argument('--iters', type=int, default=20, help='training iterations per run (20)')
    p.add_argument('--warmup', type=int, default=2, help='iterations left out of the median (2)')
    p.add_argument(
        '--backend', default='inductor', help=f'torch.compile backend, one of {suite.BACKENDS}'
    )
    p.add_argument(
        '--threads', type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    p.add_argument(
        '--timeout', type=float, default=1800, help='seconds before a run is killed (1800)'
    )
    p.add_argument(
        '--data-root',
        default=osp.join('work_dirs', 'benchmark_compile_train'),
        help='folder whose data/ holds the toy datasets (made there when absent)',
    )
    p.add_argument(
        '--out',
        default=osp.join('work_dirs', 'benchmark_compile_train', 'results.json'),
        help='the results file (JSON)',
    )
    args = p.parse_args(argv)
    unknown = [j for j in args.jobs if j not in suite.JOBS]
    if unknown:
        raise CLIError(f'--jobs: unknown {unknown}; choose from {list(suite.JOBS)}')
    if args.backend not in suite.BACKENDS:
        raise CLIError(f'--backend must be one of {suite.BACKENDS}, got {args.backend!r}')
    for opt in ('iters', 'threads', 'timeout'):
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise CLIError(f'--{opt} must be a positive number, got {value}')
    if not 0 <= args.warmup < args.iters:
        raise CLIError(f'--warmup must be in [0, --iters), got {args.warmup}')
    return args


@main_guard
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return suite.run(args, 'python -m mmcirc.benchmark compile_train ' + ' '.join(argv))
