"""Export an mmdet / mmseg / mmpretrain model of mmcirc to ONNX.

``tools/deployment/pytorch2onnx.py`` (the library side is :mod:`mmcirc.deployment.onnx`;
what the graph holds and what ``--dynamic`` and ``--verify`` do: docs/deployment.md).
Without CHECKPOINT the weights are random (the last line says so); a checkpoint that
leaves weights of the model unset is refused unless ``--allow-partial-weights`` (then one
``WARNING:`` line names what stays random). The file appears only when everything
succeeded.
"""

import argparse
import os.path as osp

from mmcirc.cli.common import (
    CLIError,
    Once,
    add_cfg_options,
    add_partial_weights_flag,
    check_config_file,
    main_guard,
    one_line_warnings,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config', help='mmdet / mmseg / mmpretrain config of an mmcirc model')
    p.add_argument(
        'checkpoint', nargs='?', help='weights (.pth); without it the weights are random'
    )
    p.add_argument(
        '--shape',
        nargs=2,
        action=Once,
        type=int,
        required=True,
        metavar=('H', 'W'),
        help='input height and width of the exported graph (and of --verify)',
    )
    p.add_argument('--out', required=True, help='output file, FILE.onnx')
    add_partial_weights_flag(p)
    p.add_argument('--dynamic', action='store_true', help='symbolic batch, height and width')
    p.add_argument(
        '--verify', action='store_true', help='compare ONNX Runtime (CPU) with torch, 1e-4 relative'
    )
    p.add_argument(
        '--features',
        action='store_true',
        help='export the backbone + neck (extract_feat) instead of mode=tensor',
    )
    p.add_argument(
        '--size-divisor',
        type=int,
        default=32,
        help='with --dynamic, H and W are symbolic multiples of this (the total '
        'stride; default 32)',
    )
    p.add_argument('--opset', type=int, default=18, help='ONNX opset (>= 17, default 18)')
    add_cfg_options(p)
    return p.parse_args(argv)


def _check_args(args):
    h, w = args.shape
    if h < 1 or w < 1:
        raise CLIError(f'--shape must be two positive ints H W, got {h} {w}')
    if args.size_divisor < 1:
        raise CLIError(f'--size-divisor must be a positive int, got {args.size_divisor}')
    if not args.out.endswith('.onnx'):
        raise CLIError(f'--out must name a .onnx file, got {args.out}')
    if osp.isdir(args.out):
        raise CLIError(f'--out is a directory: {args.out}')
    if args.opset < 17:
        raise CLIError(f'--opset must be >= 17 (the exporter targets opset 17+), got {args.opset}')
    check_config_file(args.config, args.checkpoint)
    import importlib.util

    need = ['onnx', 'onnxscript'] + (['onnxruntime'] if args.verify else [])
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        raise CLIError(f'missing packages {missing}: pip install -r requirements.txt')


@main_guard
def main(argv=None):
    one_line_warnings('build_loss', 'avg_non_ignore')  # mmseg's deprecation notes aside
    args = parse_args(argv)
    _check_args(args)
    from mmcirc.apis.builder import build_model, has_random_weights, load_model_config
    from mmcirc.deployment.onnx import ExportError, TensorModel, export_onnx

    cfg = load_model_config(args.config, args.cfg_options)
    try:
        model = build_model(
            cfg,
            args.checkpoint,
            warn_random=args.checkpoint is not None,  # one line if loaded in part
            allow_partial_weights=args.allow_partial_weights,
        )
        tensor_model = TensorModel(model, features=args.features)
        in_channels = int(getattr(getattr(model, 'backbone', None), 'in_channels', 3) or 3)
        result = export_onnx(
            tensor_model,
            tuple(args.shape),
            args.out,
            dynamic=args.dynamic,
            size_divisor=args.size_divisor,
            opset=args.opset,
            in_channels=in_channels,
            verify=args.verify,
        )
    except ExportError as err:
        raise CLIError(str(err)) from err
    h, w = args.shape
    random = ', random weights' if has_random_weights(model) else ''
    print(
        f'wrote {args.out} ({"dynamic batch/H/W" if args.dynamic else f"{h}x{w}"}, opset '
        f'{args.opset}, {len(result["outputs"])} outputs: {", ".join(result["outputs"])}'
        f'{random})'
    )
    for r in result.get('verify', []):
        print(
            f'verified with ONNX Runtime at {"x".join(map(str, r["shape"]))}: max relative '
            f'error {r["max_rel_err"]:.2e}'
        )
    return result
