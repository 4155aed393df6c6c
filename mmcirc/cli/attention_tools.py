"""What the attention-visualisation commands share (bccb_score, vis_circulant,
vis_cores): their common flags and :func:`setup`, the prologue of every run (image,
config, model, the attention layers asked for, the network input)."""

import os.path as osp
import time
import types
import warnings

from mmcirc.analysis import vis
from mmcirc.apis.builder import build_model, has_random_weights, load_model_config
from mmcirc.apis.weights import RandomWeightsWarning
from mmcirc.cli.common import (
    CLIError,
    Once,
    add_cfg_options,
    add_partial_weights_flag,
    check_config_file,
    check_device,
    check_output_dir,
    one_line_warnings,
)
from mmcirc.cli import image_io as imio


def add_common_args(parser, tool):
    """CONFIG [CHECKPOINT] (--img PATH | --demo NAME) [--size HxW] [--out-dir] ..."""
    parser.add_argument('config', help='mmdet / mmseg / mmpretrain config file')
    parser.add_argument(
        'checkpoint', nargs='?', help='checkpoint (omit: random weights, init_weights under --seed)'
    )
    src = parser.add_mutually_exclusive_group(required=True)  # one image: a repeat refused
    src.add_argument('--img', action=Once, metavar='PATH', help='image file')
    src.add_argument(
        '--demo',
        action=Once,
        metavar='NAME',
        help="scikit-image sample: 'astronaut' (also 'chelsea', 'coffee')",
    )
    parser.add_argument(
        '--size',
        help='HxW: resize the image to exactly H x W (e.g. 512x512), '
        'S: its longer side to S; either replaces the resizes and crops of the '
        "config's test pipeline",
    )
    parser.add_argument('--out-dir', default=f'work_dirs/analysis/{tool}', help='output folder')
    parser.add_argument('--seed', type=int, default=0, help='seed of random weights (0)')
    parser.add_argument('--device', default='cpu', help="'cpu' or e.g. 'cuda:0'")
    add_cfg_options(parser)
    add_partial_weights_flag(parser)
    return parser


def setup(args, forms, what):
    """The prologue of every run: warnings as one line, check the flags, read the
    image and the config, build the model (``args.checkpoint`` or random weights
    under ``args.seed``), find its backbone's attention layers of ``forms`` (none: a
    one-line error naming ``what`` and the kinds it has) and run the image through
    the test pipeline.

    Returns a namespace: ``size`` (parsed --size), ``img_name``, ``img_src``, ``cfg``,
    ``model``, ``layers`` (name, kind, module), ``inputs`` (1, 3, H, W) on
    ``args.device``, ``image`` (the input as an RGB (H, W, 3) float image, for
    overlays), ``hw`` (H, W), ``out`` (the run's output folder) and ``t0``.
    """
    from mmcirc.analysis.attention_maps import find_attention_layers

    one_line_warnings(category=UserWarning)
    warnings.filterwarnings('always', category=RandomWeightsWarning)  # shown, in one line
    check_config_file(args.config, args.checkpoint)
    size = imio.parse_size(args.size)
    sides = (size,) if isinstance(size, int) else (size or ())
    if any(s < vis.MIN_SIDE for s in sides):
        raise CLIError(
            f'--size must be at least {vis.MIN_SIDE} px per side (HxW, e.g. 512x512), '
            f'got {args.size!r}'
        )
    check_device(args.device)
    check_output_dir(args.out_dir, '--out-dir')
    [(img_name, img, _, img_src)] = imio.load_images([args.img], args.demo, size)
    cfg = load_model_config(args.config, args.cfg_options)
    t0 = time.time()
    model = build_model(
        cfg,
        args.checkpoint,
        args.device,
        seed=args.seed,
        warn_random=args.checkpoint is not None,  # one line if loaded in part
        allow_partial_weights=args.allow_partial_weights,
    )
    if not hasattr(model, 'backbone'):
        raise CLIError(f'{args.config}: {type(model).__name__} has no backbone attribute')
    layers = find_attention_layers(model.backbone, forms=forms)
    if not layers:
        found = sorted({k for _, k, _ in find_attention_layers(model.backbone)})
        raise CLIError(
            f'{args.config}: no {what} in {type(model.backbone).__name__}'
            + (f' (it has {", ".join(found)} attention)' if found else '')
        )
    try:
        inputs = vis.prepare_inputs(model, cfg, img, exact_size=size is not None)
    except ValueError as err:
        raise CLIError(f'{err}: give a larger --size HxW') from None
    h, w = inputs.shape[-2:]
    cfg_name = osp.splitext(osp.basename(args.config))[0]
    return types.SimpleNamespace(
        size=size,
        img_name=img_name,
        img_src=img_src,
        cfg=cfg,
        model=model,
        layers=layers,
        inputs=inputs.to(args.device),
        image=vis.display_image(model, inputs),
        hw=(h, w),
        t0=t0,
        out=osp.join(args.out_dir, f'{cfg_name}_{img_name}_{h}x{w}'),
    )


def record_header(args, run):
    """The JSON fields every tool writes first: what ran on which image and input."""
    return dict(
        config=args.config,
        checkpoint=args.checkpoint,
        random_weights=has_random_weights(run.model),
        seed=args.seed,
        image=run.img_src,
        input_size=list(run.hw),
        backbone=type(run.model.backbone).__name__,
    )


def capture(backbone, inputs, form, keep, bar=None):
    """Run ``backbone(inputs)`` with capture hooks on its attention layers of ``form``:
    ``keep(key, record)`` for each call (key: the layer's name, ``name#k`` for its k-th
    later call), then ``bar.update()`` when given; nothing else is kept."""
    import torch
    from mmcirc.analysis.attention_maps import AttentionCapture

    def callback(rec):
        keep(rec.name if rec.call == 0 else f'{rec.name}#{rec.call}', rec)
        if bar is not None:
            bar.update()

    with AttentionCapture(backbone, forms=(form,), callback=callback), torch.no_grad():
        backbone(inputs)


def progress(n):
    """mmengine's progress bar over ``n`` tasks (printed to stdout)."""
    from mmengine.utils import ProgressBar

    return ProgressBar(n)
