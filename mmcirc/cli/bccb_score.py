"""How close are a model's attention matrices to BCCB (block-circulant) matrices?

``tools/analysis/bccb_score.py``: per dense-attention layer (probe form ``'matrix'``) and
head, the relative Frobenius distance ``||A - P(A)|| / ||A||`` to the nearest BCCB matrix,
for the checkpoint, random weights and shuffled tokens (docs/analysis.md).
"""

import argparse
import math
import os.path as osp
import time

from mmcirc.analysis import vis
from mmcirc.cli import attention_tools as vc
from mmcirc.cli.common import CLIError, main_guard

DISPLAY = 384  # largest side of a displayed matrix (block-averaged beyond)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    vc.add_common_args(parser, 'bccb_score')
    parser.add_argument(
        '--head', type=int, default=0, help='head shown in the example heat maps (0)'
    )
    args = parser.parse_args(argv)
    if args.head < 0:
        raise CLIError(f'--head must be >= 0, got {args.head}')
    return args


# --------------------------------------------------------------------------- scoring
def _display(mat):
    """Block-average a (Nq, Nk) matrix to at most DISPLAY x DISPLAY (numpy, float)."""
    import torch.nn.functional as F

    nq, nk = mat.shape
    m = mat.float()[None, None]
    if max(nq, nk) > DISPLAY:
        m = F.adaptive_avg_pool2d(m, (min(nq, DISPLAY), min(nk, DISPLAY)))
    return m[0, 0].numpy()


def _example(attn, q_grid, k_grid, head):
    """One head's A, P(A), kernel (centred) and central query row, for display."""
    from mmcirc.analysis.bccb import bccb_expand, bccb_kernel, centre_kernel

    w = attn.shape[0] // 2  # the middle window (B = 1: the only matrix otherwise)
    a = attn[w, head]  # (Nq, Nk)
    kernel = bccb_kernel(a, q_grid, k_grid)  # (Hk, Wk)
    proj = bccb_expand(kernel, q_grid)
    i = (q_grid[0] // 2) * q_grid[1] + q_grid[1] // 2  # central query
    return dict(
        A=_display(a),
        P=_display(proj),
        kernel=centre_kernel(kernel).float().numpy(),
        row=a[i].view(*k_grid).float().numpy(),
        window=w if attn.shape[0] > 1 else None,
    )


def score(backbone, inputs, head=0, seed=0, bar=None, shuffle=True):
    """Run ``backbone(inputs)`` with capture hooks on its ``'matrix'`` attention layers
    (whatever their kind); return {layer: entry} in model order (``bar.update()`` per
    layer when given)."""
    import torch
    from mmcirc.analysis.bccb import bccb_distance, shuffle_tokens

    out = {}

    def reduce(key, rec):
        attn = rec.weights  # (B', heads, Nq, Nk)
        heads = attn.shape[1]
        e = dict(
            name=key,
            kind=rec.kind,
            q_grid=list(rec.q_grid),
            k_grid=list(rec.k_grid),
            heads=heads,
            matrices_per_head=attn.shape[0],
            distance=bccb_distance(attn, rec.q_grid, rec.k_grid, reduce_dims=(0,)).tolist(),
        )
        if shuffle:
            g = torch.Generator().manual_seed(seed + len(out))
            e['shuffled'] = bccb_distance(
                shuffle_tokens(attn, g), rec.q_grid, rec.k_grid, reduce_dims=(0,)
            ).tolist()
        e['example'] = _example(attn, rec.q_grid, rec.k_grid, min(head, heads - 1))
        e['example_head'] = min(head, heads - 1)
        out[key] = e  # nothing of the full matrices is kept

    vc.capture(backbone, inputs, 'matrix', reduce, bar)
    return out


# --------------------------------------------------------------------------- figures
def _mean(v):
    return float(sum(v) / len(v)) if v else float('nan')


def layer_figure(entry, random_entry):
    import numpy as np

    series = [('model', entry['distance'], '#1f77b4')]
    if random_entry is not None:
        series.append(('random weights', random_entry['distance'], '#ff7f0e'))
    series.append(('shuffled tokens', entry['shuffled'], '#7f7f7f'))
    heads = entry['heads']
    fig, ax = vis.subplots(figsize=(max(3.5, 0.6 * heads + 2), 2.8), dpi=100)
    width = 0.8 / len(series)
    x = np.arange(heads)
    for k, (label, vals, colour) in enumerate(series):
        ax.bar(
            x + (k - (len(series) - 1) / 2) * width,
            vals,
            width,
            label=f'{label} ({_mean(vals):.3f})',
            color=colour,
        )
    ax.set_xticks(x)
    ax.set_xticklabels([str(h) for h in range(heads)])
    ax.set_xlabel('head')
    ax.set_ylabel('||A - P(A)|| / ||A||')
    ax.set_ylim(0, 1.05 * max(1e-3, max(max(v) for _, v, _ in series)))
    grids = (
        f'{entry["q_grid"][0]}x{entry["q_grid"][1]} -> {entry["k_grid"][0]}x{entry["k_grid"][1]}'
    )
    ax.set_title(f'{vis.short_name(entry["name"])} ({entry["kind"]}, {grids})', fontsize=8)
    ax.legend(fontsize=6, loc='lower right')
    return vis.figure_png(fig)


def summary_figure(layers, random_layers):
    import numpy as np

    names = list(layers)
    width = max(layers[n]['heads'] for n in names)
    panels = [('model', {n: layers[n]['distance'] for n in names})]
    if random_layers is not None:
        rand = {n: random_layers[n]['distance'] for n in names if n in random_layers}
        panels.append(('random weights', rand))
    panels.append(('shuffled tokens', {n: layers[n]['shuffled'] for n in names}))
    fig, axes = vis.subplots(
        1,
        len(panels),
        figsize=(2.2 + 1.6 * len(panels) + 0.25 * width * len(panels), 1.2 + 0.3 * len(names)),
        dpi=100,
        squeeze=False,
    )
    for ax, (title, data) in zip(axes[0], panels):
        grid = np.full((len(names), width), np.nan)
        for r, n in enumerate(names):
            vals = data.get(n, [])
            grid[r, : len(vals)] = vals
        im = ax.imshow(grid, vmin=0, vmax=1, cmap='viridis', aspect='auto')
        ax.set_title(f'{title}\nmean {np.nanmean(grid):.3f}', fontsize=8)
        ax.set_xticks(range(width))
        ax.set_xlabel('head', fontsize=7)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(
            [vis.short_name(n) for n in names] if ax is axes[0][0] else [], fontsize=6
        )
        ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=list(axes[0]), shrink=0.8, label='||A - P(A)|| / ||A||')
    return vis.figure_png(fig)


def example_figure(entry, random_entry):
    rows = [('model', entry)] + ([('random', random_entry)] if random_entry is not None else [])
    fig, axes = vis.subplots(len(rows), 4, figsize=(11, 2.8 * len(rows)), dpi=100, squeeze=False)
    for r, (label, e) in enumerate(rows):
        ex = e['example']
        win = '' if ex['window'] is None else f', window {ex["window"]}'
        d = e['distance'][e['example_head']]
        panels = [
            (ex['A'], f'{label}: A (head {e["example_head"]}{win})'),
            (ex['P'], f'P(A), distance {d:.3f}'),
            (ex['kernel'], 'kernel of P(A), offset 0 at centre'),
            (ex['row'], 'A of the central query (key grid)'),
        ]
        for ax, (img, title) in zip(axes[r], panels):
            im = ax.imshow(
                img,
                cmap='viridis',
                interpolation='nearest',
                aspect='auto' if img.shape[0] != img.shape[1] else 'equal',
            )
            ax.set_title(title, fontsize=7)
            ax.tick_params(labelsize=5)
            fig.colorbar(im, ax=ax, shrink=0.75).ax.tick_params(labelsize=5)
    fig.suptitle(f'{vis.short_name(entry["name"])} ({entry["kind"]})', fontsize=9)
    return vis.figure_png(fig)


# --------------------------------------------------------------------------- main
@main_guard
def main(argv=None):
    args = parse_args(argv)
    run = vc.setup(
        args, ('matrix',), 'dense attention layer (SRA, Swin window or ViT self-attention)'
    )
    header = vc.record_header(args, run)
    model, run.model = run.model, None  # freed before the random-weight model is built
    (h, w), out = run.hw, run.out
    passes = 1 if args.checkpoint is None else 2
    print(f'{len(run.layers)} dense attention layers, input {h}x{w}, {passes} model(s)', flush=True)
    bar = vc.progress(len(run.layers) * passes)
    results = score(model.backbone, run.inputs, args.head, args.seed, bar)
    random_results = None
    if args.checkpoint is not None:
        del model
        rand = vc.build_model(run.cfg, None, args.device, seed=args.seed)
        random_results = score(rand.backbone, run.inputs, args.head, args.seed, bar, shuffle=False)
        del rand
    print('', flush=True)

    files = {osp.join(out, 'summary.png'): summary_figure(results, random_results)}
    for name, entry in results.items():
        rnd, short = (random_results or {}).get(name), vis.short_name(name)
        files[osp.join(out, f'layer_{short}.png')] = layer_figure(entry, rnd)
        files[osp.join(out, f'example_{short}.png')] = example_figure(entry, rnd)
    record = dict(
        header,
        definition='||A - P(A)||_F / ||A||_F, P = average over the wrapped 2-D offset '
        '(j - cell(i)) mod (Hk, Wk); windows of a head taken together',
        layers=[
            dict(
                {k: v for k, v in e.items() if k != 'example'},
                random=(random_results or {}).get(n, {}).get('distance'),
            )
            for n, e in results.items()
        ],
        time_s=round(time.time() - run.t0, 2),
    )

    def pooled(res, key):
        return _mean([v for e in res.values() for v in e[key]])

    record['mean'] = dict(model=pooled(results, 'distance'), shuffled=pooled(results, 'shuffled'))
    if random_results is not None:
        record['mean']['random'] = pooled(random_results, 'distance')
    vis.write_outputs(files, record, osp.join(out, 'bccb_score.json'))
    means = ', '.join(f'{k} {v:.3f}' for k, v in record['mean'].items() if not math.isnan(v))
    print(f'mean ||A - P(A)|| / ||A|| over {len(results)} layers: {means}')
    print(f'wrote {len(files) + 1} files to {out}/')
    return 0
