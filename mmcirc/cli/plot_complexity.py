"""Complexity vs resolution from MEASURED FLOPs (mmcirc's counter on the traced
graph, not N^2 formulas): one attention block and whole backbones.

``tools/analysis/plot_complexity.py``. Block: self-attention (qkv linear + SDPA + proj,
one head: PVT stage 1), plain multi-head attention (``nn.MultiheadAttention``, unfused), circulant attention
(``CirculantAttention``, d = 1) and core attention with C' = 8, 16, 64, on an
H x H map of ``--dims`` channels, traced on meta tensors (shapes only: no compute,
so 512 x 512 tokens of self-attention cost nothing). Backbones: the backbone cases
of :mod:`mmcirc.benchmark.cases` (those of ``python -m mmcirc.benchmark model``) at square input
sizes, traced on CPU (the tracer runs each forward once: PVT-S at 2048 px takes about
a minute; the patch-embedding convolutions cannot be traced on meta tensors). A model whose
count at one size took longer than ``--max-seconds`` is not run at larger sizes.

Writes ``DIR/complexity.json``, ``DIR/block.png``, ``DIR/backbones.png`` and prints
markdown tables (GMACs; FLOPs = multiply-adds).
"""

import argparse
import json
import os
import os.path as osp
import sys
from functools import partial

import torch

from mmcirc.analysis import vis
from mmcirc.benchmark.baselines import CoreAttentionWithBank, MHASelfAttention, SDPASelfAttention
from mmcirc.benchmark.report import markdown_table
from mmcirc.cli.common import Accumulate, check_output_dir, main_guard
from mmcirc.utils.fileio import atomic_open


def block_variants(dim):
    from mmcirc.ops import CirculantAttention

    return {
        'self-attention (SDPA)': partial(SDPASelfAttention, dim),
        'self-attention (nn.MultiheadAttention)': partial(MHASelfAttention, dim),
        'circulant': partial(CirculantAttention, dim),
        **{f"core C'={c}": partial(CoreAttentionWithBank, dim, 1, c) for c in (8, 16, 64)},
    }


def block_flops(name, make, side, dim):
    from mmcirc.analysis import count_flops

    with torch.device('meta'):
        m = make().eval()
        x = torch.randn(1, side * side, dim)
    kwargs = dict(hw_shape=(side, side)) if name == 'circulant' else {}
    return count_flops(m, x, **kwargs)


def parse_args(argv=None):
    from mmcirc.benchmark.cases import group

    backbones = group('backbone')

    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--dims', type=int, default=64, help='channels of the block')
    parser.add_argument(
        '--block-sides',
        type=int,
        nargs='+',
        action=Accumulate,
        default=[7, 14, 28, 56, 64, 112, 128, 256, 512],
        help='H = W of the token map of the block',
    )
    parser.add_argument(
        '--models',
        nargs='+',
        action=Accumulate,
        choices=sorted(backbones),
        metavar='MODEL',
        default=[
            'pvt_s',
            'ca_pvt_s',
            'circ_pvt_s',
            'core_pvt_s',
            'core_pvt_s_c8',
            'swin_t',
            'ca_swin_t',
        ],
    )
    parser.add_argument(
        '--sizes',
        type=int,
        nargs='+',
        action=Accumulate,
        default=[224, 320, 512, 768, 1024, 1536, 2048],
    )
    parser.add_argument('--no-backbones', action='store_true')
    parser.add_argument(
        '--max-seconds',
        type=float,
        default=120.0,
        help='skip larger sizes of a model once one count took longer',
    )
    parser.add_argument('--out-dir', default=osp.join('work_dirs', 'complexity'))
    return parser.parse_args(argv)


def _plot(series, xlabel, title, out_dir, file_name):
    fig, ax = vis.subplots(figsize=(7, 5))
    for i, (name, pts) in enumerate(series.items()):
        pts = [(x, y) for x, y in pts if y]
        if pts:  # alternate styles: equal curves (SDPA vs MHA) stay visible
            ax.plot(*zip(*pts), ls='-' if i % 2 == 0 else '--', marker='os^vDx'[i % 6], label=name)
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel(xlabel)
    ax.set_ylabel('GMACs (counted)')
    ax.set_title(title)
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(osp.join(out_dir, file_name), dpi=120)


def _md(series, xs, xname):
    def cells(x):
        return ['-' if v is None else f'{v:.3g}' for v in (dict(s).get(x) for s in series.values())]

    return markdown_table([xname, *series], [[x, *cells(x)] for x in xs], 'r' * (len(series) + 1))


@main_guard
def main(argv=None):
    args = parse_args(argv)
    check_output_dir(args.out_dir, '--out-dir')
    os.makedirs(args.out_dir, exist_ok=True)
    out = dict(
        unit='GMACs (multiply-adds), counted by mmcirc.analysis on the traced graph',
        block=dict(dims=args.dims, series={}),
        backbones=dict(series={}, errors={}),
    )

    # -------------------------------------------------------------- one block
    block = {
        name: [(s * s, block_flops(name, make, s, args.dims) / 1e9) for s in args.block_sides]
        for name, make in block_variants(args.dims).items()
    }
    out['block']['series'] = {
        k: [dict(tokens=n, side=int(round(n**0.5)), gmacs=g) for n, g in v]
        for k, v in block.items()
    }
    title = f'one attention layer, C = {args.dims}'
    _plot(block, 'tokens N = H x W', title, args.out_dir, 'block.png')
    print(f'\nOne attention layer, C = {args.dims}, GMACs vs tokens N:\n')
    print(_md(block, [s * s for s in args.block_sides], 'N'))

    # -------------------------------------------------------------- backbones
    if not args.no_backbones:
        import time

        from mmcirc.benchmark.cases import case, count_macs

        nets = {}
        for m in args.models:
            pts = []
            for size in sorted(args.sizes):
                t = time.perf_counter()
                try:
                    pts.append((size, count_macs(m, size) / 1e9))
                except Exception as e:  # noqa: BLE001
                    out['backbones']['errors'][f'{m}@{size}'] = f'{type(e).__name__}: {e}'[:300]
                    print(f'{m} at {size}: {type(e).__name__}: {e}'[:300], file=sys.stderr)
                took = time.perf_counter() - t
                print(
                    f'{m} at {size}: {pts[-1][1] if pts and pts[-1][0] == size else "-"} '
                    f'GMACs ({took:.1f} s)',
                    file=sys.stderr,
                )
                if took > args.max_seconds:
                    out['backbones']['errors'][f'{m}>{size}'] = f'skipped: {took:.0f} s at {size}'
                    break
            nets[case(m).label] = pts
        out['backbones']['series'] = {
            k: [dict(size=s, gmacs=g) for s, g in v] for k, v in nets.items()
        }
        _plot(nets, 'input size (px, square)', 'backbones, batch 1', args.out_dir, 'backbones.png')
        print('\nBackbones, GMACs vs input size:\n')
        print(_md(nets, args.sizes, 'size'))
    path = osp.join(args.out_dir, 'complexity.json')
    with atomic_open(path, 'w') as f:
        json.dump(out, f, indent=1)
    print('\nwrote', path, 'and the PNGs in', args.out_dir)
