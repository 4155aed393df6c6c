"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.sharded`
(``tools/analysis/benchmark_sharded.py``, ``python -m mmcirc.benchmark sharded``):
its flags, their checks, the one ``error:`` line and exit 1; the suite measures and writes."""

import argparse
import os.path as osp

from mmcirc.benchmark.suites import sharded as suite
from mmcirc.cli.common import CLIError, main_guard


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=suite.__doc__.splitlines()[0])
    p.add_argument('configs', nargs='+', help='mmseg configs of shardable segmentors')
    p.add_argument('--size', type=int, default=2048, help='image side S (S x S), default 2048')
    p.add_argument('--nprocs', type=int, nargs='+', default=[1, 2], help='values of P')
    p.add_argument('--threads', type=int, default=2, help='torch threads of one process')
    p.add_argument(
        '--train', action='store_true', help='measure one training step instead of inference'
    )
    p.add_argument('--out-dir', default='work_dirs/benchmark_sharded')
    args = p.parse_args(argv)
    if args.size < 32:
        raise CLIError(f'--size must be >= 32, got {args.size}')
    if min(args.nprocs) < 1 or args.threads < 1:
        raise CLIError(f'--nprocs and --threads must be >= 1, got {args.nprocs} {args.threads}')
    for cfg in args.configs:
        if not osp.isfile(cfg):
            raise CLIError(f'config file not found: {cfg}')
    return args


@main_guard
def main(argv=None):
    return suite.run(parse_args(argv))
