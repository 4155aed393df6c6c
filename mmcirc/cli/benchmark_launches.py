"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.launches`
(``python -m mmcirc.benchmark launches``): its flags, their checks, the one ``error:``
line and exit 1; the suite measures and writes."""

import argparse
import os.path as osp
import sys

from mmcirc.benchmark.suites import launches as suite
from mmcirc.cli.common import CLIError, main_guard, parse_hw

TOOL = 'tools/analysis/benchmark_launches.py'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=suite.__doc__.splitlines()[0])
    p.add_argument(
        '--models',
        nargs='+',
        default=list(suite.PAIRS),
        metavar='MODEL',
        help=f'from {list(suite.PAIRS)} (each runs beside its peer)',
    )
    p.add_argument('--sizes', nargs='+', default=suite.DEFAULT_SIZES, metavar='S')
    p.add_argument(
        '--host-size', type=int, default=64, help='the size whose forward time is reported'
    )
    p.add_argument('--repeat', type=int, default=20, help='timed forwards at the host size')
    p.add_argument('--threads', type=int, default=1, help='torch intra-op threads')
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_launches'))
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in suite.PAIRS]
    if unknown:
        raise CLIError(f'--models: unknown {unknown}; choose from {list(suite.PAIRS)}')
    for opt in ('repeat', 'threads', 'host_size'):
        if getattr(args, opt) < 1:
            raise CLIError(
                f'--{opt.replace("_", "-")} must be a positive int, got {getattr(args, opt)}'
            )
    args.sizes = [parse_hw(s, '--sizes', suite.MULTIPLE) for s in args.sizes]
    if any(h != w for h, w in args.sizes):
        raise CLIError(f'--sizes must be square sizes S, got {args.sizes}')
    if (args.host_size, args.host_size) not in args.sizes:
        raise CLIError(f'--host-size {args.host_size} must be one of --sizes')
    return args


@main_guard
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return suite.run(args, f'python {TOOL} ' + ' '.join(argv))
