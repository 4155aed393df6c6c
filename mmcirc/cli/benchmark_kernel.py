"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.kernel`
(``tools/deployment/benchmark_kernel.py``, ``python -m mmcirc.benchmark kernel``): its
flags, their checks, the one ``error:`` line and exit 1; the suite measures and writes."""

import argparse
import os.path as osp
import sys

from mmcirc.benchmark.measurement import PRECISIONS
from mmcirc.benchmark.suites import kernel as suite
from mmcirc.cli.common import CLIError, main_guard

TOOL = 'tools/deployment/benchmark_kernel.py'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=suite.__doc__.splitlines()[0])
    p.add_argument('--device', default=None, help='cuda or cpu (default: cuda if present)')
    p.add_argument('--sizes', nargs='+', type=int, default=suite.DEFAULT_SIZES, metavar='S')
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--dim', type=int, default=192, help='channels C (CA-DeiT-T: 192)')
    p.add_argument('--precision', default='bf16', choices=list(PRECISIONS))
    p.add_argument('--repeat', type=int, default=20, help='timed calls per layer')
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_kernel'))
    args = p.parse_args(argv)
    for name in ('batch', 'dim', 'repeat'):
        if getattr(args, name) < 1:
            raise CLIError(f'--{name} must be a positive int, got {getattr(args, name)}')
    if any(s < 1 or s > 64 for s in args.sizes):
        raise CLIError(f"--sizes must lie in 1..64 (the kernel's maps), got {args.sizes}")
    if args.device not in (None, 'cuda', 'cpu'):
        raise CLIError(f'--device must be cuda or cpu, got {args.device!r}')
    return args


@main_guard
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    import torch

    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise CLIError('--device cuda: no CUDA device')
    return suite.run(args, f'python {TOOL} ' + ' '.join(argv))
