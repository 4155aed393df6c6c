"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.isotropic`
(``tools/analysis/benchmark_isotropic.py``, ``python -m mmcirc.benchmark isotropic``):
its flags, their checks, the one ``error:`` line and exit 1; the suite measures and writes."""

import argparse
import os.path as osp
import sys

from mmcirc.benchmark.measurement import PRECISIONS
from mmcirc.benchmark.suites import isotropic as suite
from mmcirc.cli.common import CLIError, main_guard, parse_hw

TOOL = 'tools/analysis/benchmark_isotropic.py'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=suite.__doc__.splitlines()[0])
    p.add_argument(
        '--models',
        nargs='+',
        default=suite.DEFAULT_MODELS,
        metavar='MODEL',
        help=f'from {suite.MODELS}',
    )
    p.add_argument('--sizes', nargs='+', default=suite.DEFAULT_SIZES, metavar='S|HxW')
    p.add_argument('--repeat', type=int, default=5, help='timed forwards after the warm-up')
    p.add_argument(
        '--single-run-above',
        type=float,
        default=20.0,
        help='seconds: a slower warm-up is the reported time (one run)',
    )
    p.add_argument(
        '--depth', type=int, default=None, help='keep the first DEPTH blocks (smoke tests)'
    )
    p.add_argument(
        '--threads', type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    p.add_argument('--no-flops', dest='flops', action='store_false', help='skip FLOP counting')
    p.add_argument(
        '--flops-only', action='store_true', help='count FLOPs only, add them to DIR/results.json'
    )
    p.add_argument('--timeout', type=float, default=3600.0, help='seconds per measurement')
    p.add_argument('--device', default='cpu', help='cpu or cuda')
    p.add_argument('--precision', default='fp32', choices=tuple(PRECISIONS), help='autocast dtype')
    p.add_argument('--batch', type=int, default=1, help='batch size')
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_isotropic'))
    p.add_argument('--fresh', action='store_true', help='ignore earlier results in out-dir')
    args = p.parse_args(argv)
    if args.flops_only and not args.flops:
        raise CLIError('--flops-only and --no-flops exclude each other')
    unknown = [m for m in args.models if m not in suite.MODELS]
    if unknown:
        raise CLIError(f'--models: unknown {unknown}; choose from {suite.MODELS}')
    for opt in ('repeat', 'depth', 'threads', 'batch'):
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise CLIError(f'--{opt} must be a positive int, got {value}')
    for opt in ('single_run_above', 'timeout'):
        if getattr(args, opt) <= 0:
            raise CLIError(f'--{opt.replace("_", "-")} must be > 0, got {getattr(args, opt)}')
    args.sizes = [parse_hw(s, '--sizes', suite.PATCH) for s in args.sizes]
    return args


@main_guard
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return suite.run(args, f'python {TOOL} ' + ' '.join(argv))
