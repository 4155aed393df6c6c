"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.backbone`
(``tools/analysis/benchmark_backbone.py``, ``python -m mmcirc.benchmark backbone``):
its flags, their checks, the one ``error:`` line and exit 1; the suite measures and writes."""

import argparse
import os.path as osp

from mmcirc.benchmark.measurement import PRECISIONS
from mmcirc.benchmark.suites import backbone as suite
from mmcirc.cli.common import CLIError, check_stride_sizes, main_guard


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=suite.__doc__.split('\n')[0])
    p.add_argument(
        '--models',
        nargs='+',
        default=suite.DEFAULT_MODELS,
        choices=suite.ZOO,
        metavar='MODEL',
        help=f'from {suite.ZOO}',
    )
    p.add_argument('--sizes', nargs='+', type=int, default=suite.DEFAULT_SIZES)
    p.add_argument('--device', default=None, help='cpu or cuda (default: cuda if present)')
    p.add_argument('--threads', type=int, default=0, help='CPU threads (0: torch default)')
    p.add_argument('--timeout', type=float, default=300.0, help='seconds per measurement')
    p.add_argument('--repeats', type=int, default=10, help='most timed runs')
    p.add_argument('--min-repeats', type=int, default=1, help='fewest timed runs')
    p.add_argument('--budget', type=float, default=10.0, help='seconds of timed runs')
    p.add_argument(
        '--single-run-above',
        type=float,
        default=30.0,
        help='warm-up seconds above which the warm-up is the measurement',
    )
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_backbone'))
    p.add_argument(
        '--flops', action='store_true', help='also count FLOPs (one more forward per model)'
    )
    p.add_argument(
        '--precisions',
        nargs='+',
        default=['fp32'],
        choices=tuple(PRECISIONS),
        help='fp32, and / or autocast to bf16 / fp16: one table each (stem suffix _bf16 / _fp16)',
    )
    p.add_argument('--batch', type=int, default=1, help='batch size (files: _b<N> unless 1)')
    p.add_argument(
        '--backward',
        action='store_true',
        help="time the training step (forward + backward of the outputs' sum; files: _fwdbwd)",
    )
    p.add_argument('--fresh', action='store_true', help='ignore earlier results in out-dir')
    return p.parse_args(argv)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    check_stride_sizes(args.sizes)
    if args.batch < 1:
        raise CLIError(f'--batch must be a positive int, got {args.batch}')
    return suite.run(args)
