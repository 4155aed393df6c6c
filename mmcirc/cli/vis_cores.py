"""Which patches each core gathers from, per core-attention layer and core budget C'.

``tools/analysis/vis_cores.py``: the gather weights of every core over the patches,
captured with a forward hook for each C' of ``--num-cores`` (``set_num_cores``), painted
on the image and averaged over the heads (docs/analysis.md).
"""

import argparse
import math
import os.path as osp
import time

from mmcirc.analysis import vis
from mmcirc.cli import attention_tools as vc
from mmcirc.ops.core import parse_num_cores
from mmcirc.cli.common import Accumulate, CLIError, main_guard

MAX_GRID = 64  # cores shown in one cores_<layer>_C<k>.png


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    vc.add_common_args(parser, 'vis_cores')
    parser.add_argument(
        '--num-cores',
        nargs='+',
        action=Accumulate,
        default=['8', '16', '64'],
        metavar='C',
        help="core counts C' to compare: ints in [1, num_cores_max] or "
        'mobile (8) / edge (32) / server (64); default 8 16 64',
    )
    parser.add_argument('--show', type=int, default=8, help='cores per row of compare_*.png (8)')
    args = parser.parse_args(argv)
    if args.show < 1:
        raise CLIError(f'--show must be >= 1, got {args.show}')
    parse_counts(args.num_cores)  # well formed before the slow part
    return args


def parse_counts(values, maximum=None):
    """--num-cores values -> sorted unique ints in [1, maximum] (the backbone's
    num_cores_max), through :func:`mmcirc.ops.core.parse_num_cores` (its ValueError)."""
    return sorted({parse_num_cores(v, maximum, name='--num-cores') for v in values})


def capture_gathers(model, inputs, bar):
    """{layer: (gather (heads, C', N) float64, (h, w))} for the current core count."""
    out = {}

    def keep(key, rec):
        if rec.q_grid is None:
            raise CLIError(
                f'{rec.name}: the patch grid of this core layer is unknown (its block '
                'does not pass hw_shape)'
            )
        out[key] = (rec.weights[0].double(), tuple(rec.q_grid))

    vc.capture(model.backbone, inputs, 'gather', keep, bar)
    return out


def gather_stats(gather, grid):
    """Per core (mean over heads): entropy, exp(entropy), entropy / log N, max weight,
    strongest patch; and the largest |row sum - 1|."""
    from mmcirc.analysis.bccb import gather_entropy

    heads, ncores, n = gather.shape
    ent = gather_entropy(gather)  # (heads, C')
    mean_map = gather.mean(0)  # (C', N)
    top = mean_map.argmax(-1)
    cores = [
        dict(
            entropy=float(ent[:, c].mean()),
            effective_patches=float(ent[:, c].exp().mean()),
            normalised_entropy=float(ent[:, c].mean() / math.log(n)) if n > 1 else 0.0,
            max_weight=float(gather[:, c].max(-1).values.mean()),
            strongest_patch=[int(top[c]) // grid[1], int(top[c]) % grid[1]],
        )
        for c in range(ncores)
    ]
    return dict(
        cores=cores,
        row_sum_error=float((gather.sum(-1) - 1).abs().max()),
        mean_normalised_entropy=sum(c['normalised_entropy'] for c in cores) / ncores,
    )


def core_panel(ax, image, mean_map, c, grid):
    """Core ``c``'s row of ``mean_map`` (C', N) on the ``grid``, painted over the image."""
    m = mean_map[c].view(*grid).float().numpy()
    vis.overlay_map(
        ax, image, m, cmap='inferno', vmin=None, vmax=None, title=f'core {c}, max {m.max():.4f}'
    )


def compare_figure(name, per_count, image, show):
    counts = sorted(per_count)
    cols = 1 + min(show, max(counts))
    fig, axes = vis.subplots(
        len(counts), cols, figsize=(1.7 * cols, 1.8 * len(counts) + 0.3), dpi=100, squeeze=False
    )
    for ax in axes.flat:
        ax.set_axis_off()
    for r, k in enumerate(counts):
        gather, grid = per_count[k]
        mean_map = gather.mean(0)  # (C', N)
        ax = axes[r][0]
        h, w = image.shape[:2]
        ax.imshow(vis.thumbnail(image), extent=(0, w, h, 0))
        ax.imshow(
            # the core of the largest raw weight on each patch (weights normalised over
            # the cores first would hide weak cores)
            mean_map.argmax(0).view(*grid).numpy(),
            cmap='tab20' if k <= 20 else 'hsv',
            alpha=0.55,
            extent=(0, w, h, 0),
            interpolation='nearest',
            vmin=0,
            vmax=max(k - 1, 1),
        )
        ax.set_title(f"C'={k}: strongest core", fontsize=7)
        for c in range(min(show, k)):
            core_panel(axes[r][1 + c], image, mean_map, c, grid)
    grid = per_count[counts[0]][1]
    fig.suptitle(
        f'{vis.short_name(name)}: gather weights (mean over heads) on the {grid[0]}x{grid[1]} '
        f'patch grid, colours min-max per panel (uniform = {1 / (grid[0] * grid[1]):.4f})',
        fontsize=8,
    )
    return vis.figure_png(fig)


def cores_figure(name, k, gather, grid, image):
    mean_map = gather.mean(0)
    n = min(k, MAX_GRID)
    cols = min(8, n)
    rows = math.ceil(n / cols)
    fig, axes = vis.subplots(
        rows, cols, figsize=(1.5 * cols, 1.5 * rows + 0.3), dpi=100, squeeze=False
    )
    for ax in axes.flat:
        ax.set_axis_off()
    for c in range(n):
        core_panel(axes.flat[c], image, mean_map, c, grid)
    more = f' (first {n} of {k})' if n < k else ''
    fig.suptitle(
        f"{vis.short_name(name)}, C'={k}{more}: gather weights (mean over heads), "
        f'colours min-max per panel; uniform = {1 / gather.shape[-1]:.4f}',
        fontsize=8,
    )
    return vis.figure_png(fig)


def entropy_figure(stats, counts):
    fig, ax = vis.subplots(figsize=(4.5, 3.0), dpi=100)
    for name, per in stats.items():
        xs = [k for k in counts if k in per]
        mean = [per[k]['mean_normalised_entropy'] for k in xs]
        lo = [min(c['normalised_entropy'] for c in per[k]['cores']) for k in xs]
        hi = [max(c['normalised_entropy'] for c in per[k]['cores']) for k in xs]
        (line,) = ax.plot(xs, mean, 'o-', label=vis.short_name(name), ms=3)
        ax.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
    ax.set_xscale('log', base=2)
    ax.set_xticks(counts)
    ax.set_xticklabels([str(k) for k in counts])
    ax.set_xlabel("active cores C'")
    ax.set_ylabel('gather entropy / log N')
    ax.set_ylim(0, 1.02)
    ax.set_title(
        "how spread each core's gather is (1 = uniform; band: min-max over cores)", fontsize=7
    )
    ax.legend(fontsize=5)
    return vis.figure_png(fig)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    run = vc.setup(args, ('gather',), 'core attention layer')
    backbone = run.model.backbone
    if not hasattr(backbone, 'set_num_cores'):
        raise CLIError(f"{type(backbone).__name__} has no set_num_cores(): cannot vary C'")
    counts = parse_counts(args.num_cores, getattr(backbone, 'num_cores_max', None))
    (h, w), out = run.hw, run.out
    print(f"{len(run.layers)} core layers, input {h}x{w}, C' in {counts}", flush=True)
    bar = vc.progress(len(run.layers) * len(counts))
    original = backbone.num_cores
    gathers = {}  # layer -> {C': (gather, grid)}
    try:
        for k in counts:
            backbone.set_num_cores(k)
            for name, value in capture_gathers(run.model, run.inputs, bar).items():
                gathers.setdefault(name, {})[k] = value
    finally:
        backbone.set_num_cores(original)
    print('', flush=True)

    files, stats = {}, {}
    for name, per in gathers.items():
        files[osp.join(out, f'compare_{vis.short_name(name)}.png')] = compare_figure(
            name, per, run.image, args.show
        )
        for k, (gather, grid) in per.items():
            files[osp.join(out, f'cores_{vis.short_name(name)}_C{k}.png')] = cores_figure(
                name, k, gather, grid, run.image
            )
        stats[name] = {k: gather_stats(g, grid) for k, (g, grid) in per.items()}
    files[osp.join(out, 'entropy.png')] = entropy_figure(stats, counts)
    record = dict(
        vc.record_header(args, run),
        num_cores=counts,
        layers=[
            dict(
                name=n,
                grid=list(next(iter(gathers[n].values()))[1]),
                heads=int(next(iter(gathers[n].values()))[0].shape[0]),
                per_num_cores={str(k): v for k, v in per.items()},
            )
            for n, per in stats.items()
        ],
        time_s=round(time.time() - run.t0, 2),
    )
    vis.write_outputs(files, record, osp.join(out, 'vis_cores.json'))
    for name, per in stats.items():
        line = ', '.join(f"C'={k}: {v['mean_normalised_entropy']:.3f}" for k, v in per.items())
        print(f'{vis.short_name(name)}: entropy / log N {line}')
    print(f'wrote {len(files) + 1} files to {out}/')
    return 0
