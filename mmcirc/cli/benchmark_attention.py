"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.attention`
(``tools/analysis/benchmark_attention.py``, ``python -m mmcirc.benchmark attention``):
its flags, their checks, the one ``error:`` line and exit 1; the suite measures and writes."""

import argparse
import os.path as osp

from mmcirc.benchmark.suites import attention as suite
from mmcirc.cli.common import CLIError, main_guard


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description='Benchmark global softmax attention vs circulant and core attention.'
    )
    p.add_argument(
        '--sizes', type=int, nargs='+', default=[32, 64, 128, 256, 512], help='map sides H = W'
    )
    p.add_argument('--repeat', type=int, default=5, help='timed runs')
    p.add_argument('--device', default='cpu', help="'cpu' or 'cuda'")
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_attention'))
    p.add_argument(
        '--max-seconds',
        type=float,
        default=suite.MAX_SECONDS_PER_MEASUREMENT,
        help='timed seconds per method and size before its rounds stop (at least 2 runs)',
    )
    p.add_argument(
        '--amp',
        choices=['bf16', 'fp16'],
        default=None,
        help='run under torch.autocast with this dtype',
    )
    p.add_argument('--no-backward', action='store_true', help='forward only')
    p.add_argument(
        '--threads', type=int, default=None, help='torch threads of the workers (default: torch)'
    )
    p.add_argument(
        '--methods',
        nargs='+',
        default=list(suite.METHODS),
        choices=suite.METHODS,
        help='subset of methods',
    )
    p.add_argument('--timeout', type=float, default=None, help='seconds per child (default: none)')
    p.add_argument('--fresh', action='store_true', help='ignore earlier results in out-dir')
    return p.parse_args(argv)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    import torch

    if args.device == 'cuda' and not torch.cuda.is_available():
        raise CLIError('--device cuda: CUDA is not available')
    if any(s < 1 for s in args.sizes) or args.repeat < 1:
        raise CLIError(f'--sizes and --repeat must be positive, got {args.sizes}, {args.repeat}')
    return suite.run(args)
