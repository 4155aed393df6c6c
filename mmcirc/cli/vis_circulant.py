"""The global kernels circulant attention learned, and the backbone's effective
receptive field.

``tools/analysis/vis_circulant.py``: the kernels are captured with a forward hook and
shown with offset 0 at the centre; the ERF of output ``s`` is ``|d y / d x|`` summed over
the colour channels, y the sum over channels of output s at its central position
(docs/analysis.md).
"""

import argparse
import math
import os.path as osp
import time

from mmcirc.analysis import vis
from mmcirc.cli import attention_tools as vc
from mmcirc.cli.common import Accumulate, CLIError, main_guard

ERF_DECADES = 6


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    vc.add_common_args(parser, 'vis_circulant')
    parser.add_argument(
        '--channels',
        type=int,
        default=16,
        help='channel (head) kernels shown per layer, evenly spaced (16)',
    )
    parser.add_argument(
        '--overlay', action='store_true', help="paint the central token's attention over the image"
    )
    erf = parser.add_mutually_exclusive_group()
    erf.add_argument(
        '--erf-stages',
        type=int,
        nargs='+',
        action=Accumulate,
        metavar='S',
        help='backbone outputs (indices into its out_indices outputs) for the ERF; default: all',
    )
    erf.add_argument('--no-erf', action='store_true', help='skip the effective receptive field')
    args = parser.parse_args(argv)
    if args.channels < 1:
        raise CLIError(f'--channels must be >= 1, got {args.channels}')
    return args


# --------------------------------------------------------------------------- kernels
def capture_kernels(model, inputs, bar):
    """{layer: dict(kernel (heads, Kh, Kw) centred, grid, boundary)} of every circulant layer."""
    from mmcirc.analysis.bccb import centre_kernel

    out = {}

    def keep(key, rec):
        boundary = rec.extra['boundary']
        out[key] = dict(
            kernel=centre_kernel(rec.weights[0], boundary).float(),
            grid=rec.q_grid,
            boundary=boundary,
        )

    vc.capture(model.backbone, inputs, 'kernel', keep, bar)
    return out


def central_attention(kernel, grid, boundary):
    """Attention of the central token over the H x W map, from a centred kernel."""
    h, w = grid
    if boundary == 'circular':
        return kernel  # centred kernel index (H//2 + dr, W//2 + dc) = token of offset (dr, dc)
    r0, c0 = h - 1 - h // 2, w - 1 - w // 2  # offsets -H//2 .. H-1-H//2 inside the map
    crop = kernel[..., r0 : r0 + h, c0 : c0 + w]
    return crop / crop.sum((-2, -1), keepdim=True)


def _centre(shape, boundary):
    """Index of offset 0 in a centred kernel (..., Kh, Kw)."""
    kh, kw = shape[-2:]
    return (kh // 2, kw // 2) if boundary == 'circular' else ((kh - 1) // 2, (kw - 1) // 2)


def kernel_stats(kernel, boundary):
    """Per head: peak offset (dr, dc), peak value, entropy (nats), exp(entropy)."""
    import torch

    heads, kh, kw = kernel.shape
    flat = kernel.flatten(1).double()
    peak, idx = flat.max(-1)
    ent = -(flat * flat.clamp_min(1e-300).log()).sum(-1)
    centre = _centre(kernel.shape, boundary)
    return [
        dict(
            peak_offset=[int(i // kw) - centre[0], int(i % kw) - centre[1]],
            peak=float(p),
            entropy=float(e),
            effective_offsets=float(torch.exp(e)),
        )
        for p, i, e in zip(peak, idx, ent)
    ]


def _pick(heads, n):
    if heads <= n:
        return list(range(heads))
    return sorted({round(k * (heads - 1) / (n - 1)) for k in range(n)}) if n > 1 else [0]


def kernel_figure(name, entry, image, n_show, overlay):
    kernel, grid, boundary = entry['kernel'], entry['grid'], entry['boundary']
    heads = kernel.shape[0]
    chosen = _pick(heads, n_show)
    maps = [('mean of %d' % heads, kernel.mean(0))] + [(f'ch {c}', kernel[c]) for c in chosen]
    if overlay:
        maps = [(t, central_attention(m, grid, boundary)) for t, m in maps]
    cols = min(6, len(maps))
    rows = math.ceil(len(maps) / cols)
    fig, axes = vis.subplots(
        rows, cols, figsize=(1.9 * cols, 1.9 * rows + 0.3), dpi=100, squeeze=False
    )
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, (title, m) in zip(axes.flat, maps):
        m = m.numpy()
        if overlay:
            vis.overlay_map(
                ax, image, m, title=f'{title}, max {m.max():.4f}', alpha=0.6, vmin=None, vmax=None
            )
        else:
            ax.imshow(m, cmap='magma', interpolation='nearest')
            cr, cc = _centre(m.shape, boundary)
            ax.plot([cc], [cr], '+', color='cyan', ms=5)
            ax.set_title(f'{title}, max {m.max():.4f}', fontsize=7)
    what = "central token's attention" if overlay else 'kernels p, offset 0 at +'
    what += ', colours min-max per panel'
    fig.suptitle(f'{vis.short_name(name)}: {grid[0]}x{grid[1]} map, {boundary}, {what}', fontsize=8)
    return vis.figure_png(fig)


# --------------------------------------------------------------------------- ERF
def effective_receptive_field(model, inputs, stages, bar):
    """[(stage, (h, w) of the output, |grad| map (H, W) numpy)] for each stage index."""
    import torch

    x = inputs.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        feats = model.backbone(x)
        feats = feats if isinstance(feats, (tuple, list)) else (feats,)
        bad = [s for s in stages if not -len(feats) <= s < len(feats)]
        if bad:
            raise CLIError(
                f'--erf-stages must be in [0, {len(feats) - 1}] (the backbone has '
                f'{len(feats)} outputs), got {bad}'
            )
        out = []
        for k, s in enumerate(stages):
            f = feats[s]
            if f.dim() != 4:
                raise CLIError(f'backbone output {s} is not a (B, C, H, W) map: {tuple(f.shape)}')
            fh, fw = f.shape[-2:]
            y = f[0, :, fh // 2, fw // 2].sum()
            (g,) = torch.autograd.grad(y, x, retain_graph=k < len(stages) - 1)
            out.append((s, (int(fh), int(fw)), g[0].abs().sum(0).cpu().numpy()))
            bar.update()
    return out


def erf_radii(grad, fractions=(0.5, 0.9)):
    """Radii (px) around the image centre holding the given fractions of sum |grad|."""
    import numpy as np

    h, w = grad.shape
    yy, xx = np.mgrid[0:h, 0:w]
    r = np.hypot(yy - (h - 1) / 2, xx - (w - 1) / 2).ravel()
    order = np.argsort(r)
    cum = np.cumsum(grad.ravel()[order])
    total = cum[-1] if cum[-1] > 0 else 1.0
    return {
        f'r{int(f * 100)}_px': float(r[order][min(np.searchsorted(cum, f * total), len(r) - 1)])
        for f in fractions
    }


def erf_figure(erfs, image):
    import numpy as np

    fig, axes = vis.subplots(1, len(erfs), figsize=(3.0 * len(erfs), 3.2), dpi=100, squeeze=False)
    for ax, (s, hw, g) in zip(axes[0], erfs):
        # log scale over ERF_DECADES decades below the peak: a global floor stays visible
        decades = np.log10(np.maximum(g, 1e-30) / max(g.max(), 1e-30))
        m = np.clip(decades, -ERF_DECADES, 0) / ERF_DECADES + 1
        vis.overlay_map(
            ax,
            image,
            m,
            cmap='inferno',
            alpha=0.65,
            vmax=1.0,
            title=f'output {s} ({hw[0]}x{hw[1]}): ERF of its centre',
        )
    fig.suptitle(
        f'effective receptive field |d y_centre / d image|, log scale '
        f'({ERF_DECADES} decades below the peak)',
        fontsize=8,
    )
    return vis.figure_png(fig)


# --------------------------------------------------------------------------- main
@main_guard
def main(argv=None):
    args = parse_args(argv)
    run = vc.setup(args, ('kernel',), 'circulant attention layer')
    model, inputs, image, (h, w), out = run.model, run.inputs, run.image, run.hw, run.out
    n_out = len(getattr(model.backbone, 'out_indices', ()) or ())
    stages = [] if args.no_erf else args.erf_stages or list(range(n_out or 1))
    print(f'{len(run.layers)} circulant layers, input {h}x{w}', flush=True)
    bar = vc.progress(len(run.layers) + len(stages))
    kernels = capture_kernels(model, inputs, bar)
    erfs = effective_receptive_field(model, inputs, stages, bar) if stages else []
    print('', flush=True)

    files = {}
    for name, entry in kernels.items():
        files[osp.join(out, f'kernels_{vis.short_name(name)}.png')] = kernel_figure(
            name, entry, image, args.channels, args.overlay
        )
    if erfs:
        files[osp.join(out, 'erf.png')] = erf_figure(erfs, image)
    record = dict(
        vc.record_header(args, run),
        layers=[
            dict(
                name=n,
                grid=list(e['grid']),
                boundary=e['boundary'],
                heads=e['kernel'].shape[0],
                kernel_shape=list(e['kernel'].shape[-2:]),
                offset_zero_weight_mean=float(
                    e['kernel'][(slice(None),) + _centre(e['kernel'].shape, e['boundary'])].mean()
                ),
                channels=kernel_stats(e['kernel'], e['boundary']),
            )
            for n, e in kernels.items()
        ],
        erf=[dict(output=s, grid=list(hw), **erf_radii(g)) for s, hw, g in erfs],
        time_s=round(time.time() - run.t0, 2),
    )
    vis.write_outputs(files, record, osp.join(out, 'vis_circulant.json'))
    print(f'wrote {len(files) + 1} files to {out}/')
    return 0
