"""The command line of the benchmark suite :mod:`mmcirc.benchmark.suites.gpu`
(``tools/deployment/benchmark_gpu.py``, ``python -m mmcirc.benchmark gpu``):
its flags, their checks, the one ``error:`` line and exit 1; the suite measures and writes."""

import argparse
import importlib.util
import os.path as osp

from mmcirc.benchmark.measurement import COMPILE_MODES
from mmcirc.benchmark.suites import gpu as suite
from mmcirc.cli.common import CLIError, main_guard


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=suite.__doc__.splitlines()[0])
    p.add_argument('--device', default=None, help='cuda or cpu (default: cuda if present)')
    p.add_argument('--models', nargs='+', default=['deit_t', 'ca_deit_t'], choices=suite.MODELS)
    p.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024, 1536, 2048, 3072, 4096])
    p.add_argument('--batches', nargs='+', type=int, default=[1, 32])
    p.add_argument('--precisions', nargs='+', default=['bf16', 'fp32'], choices=suite.PRECISIONS)
    p.add_argument('--modes', nargs='+', default=['eager', 'compile'], choices=['eager', 'compile'])
    p.add_argument('--compile-mode', default='reduce-overhead', choices=COMPILE_MODES)
    p.add_argument(
        '--compile-backend',
        default='inductor',
        help="torch.compile backend ('eager'/'aot_eager' only trace)",
    )
    p.add_argument(
        '--compile-max-size', type=int, default=2048, help='compile only up to this size'
    )
    p.add_argument('--repeat', type=int, default=10, help='timed calls per cell')
    p.add_argument(
        '--depth', type=int, default=12, help='keep the first DEPTH blocks (12: the real models)'
    )
    p.add_argument(
        '--budget-s',
        type=float,
        default=480.0,
        help='stop starting new cells after this many seconds',
    )
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_gpu'))
    args = p.parse_args(argv)
    for name in ('repeat', 'budget_s', 'compile_max_size', 'depth'):
        if getattr(args, name) <= 0:
            raise CLIError(f'--{name.replace("_", "-")} must be > 0, got {getattr(args, name)}')
    if any(b < 1 for b in args.batches):
        raise CLIError(f'--batches must be positive ints, got {args.batches}')
    if any(s < suite.PATCH or s % suite.PATCH for s in args.sizes):
        raise CLIError(
            f'--sizes must be multiples of the patch size {suite.PATCH}, got {args.sizes}'
        )
    return args


@main_guard
def main(argv=None):
    args = parse_args(argv)
    import torch

    if importlib.util.find_spec('timm') is None:
        raise CLIError('benchmark_gpu.py needs timm (the DeiT / ViT baselines): pip install timm')
    args.device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if args.device not in ('cuda', 'cpu'):
        raise CLIError(f'--device must be cuda or cpu, got {args.device!r}')
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise CLIError('--device cuda: CUDA is not available')
    return suite.run(args)
