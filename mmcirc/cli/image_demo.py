"""``tools/image_demo.py``: an image or a folder of images through a config and a
checkpoint, painted, as mmdet's ``demo/image_demo.py`` (and mmseg's): the config's
``default_scope`` picks mmdet's ``DetInferencer`` or mmseg's ``MMSegInferencer``, which
read, predict, paint and write; the model is :func:`mmcirc.apis.build_model`'s (a
checkpoint that does not fit it is refused, loading in part needs
``--allow-partial-weights`` and says so). Files are written under ``--out-dir`` as the
Inferencers name them (``vis/<image file>``; mmdet: ``preds/<image name>.json``, mmseg:
``pred/<NNNNNNNN>_pred.png``, the label map of the N-th image, counted from 0); one that
exists already is refused, never overwritten.
"""

import argparse
import os
import os.path as osp

from mmcirc.cli.common import (
    CLIError,
    add_partial_weights_flag,
    add_trust_flag,
    as_cli_errors,
    check_config_file,
    check_device,
    check_output_dir,
    main_guard,
    one_line_warnings,
    refused_checkpoints,
    show_or_warn,
    trust_if_asked,
)

#: the image files a folder gives (mmcv's and the Inferencers' list)
IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
#: the Inferencer of each library
INFERENCERS = {'mmdet': 'mmdet.apis.DetInferencer', 'mmseg': 'mmseg.apis.MMSegInferencer'}
#: the flags of one library's demo only (dest: library)
OWN_FLAGS = dict(
    pred_score_thr='mmdet',
    palette='mmdet',
    no_save_vis='mmdet',
    no_save_pred='mmdet',
    print_result='mmdet',
    opacity='mmseg',
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Paint the predictions of a model on images')
    parser.add_argument('inputs', help='an image file or a folder of images')
    parser.add_argument('config', help='config file (mmdet or mmseg)')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint file (or --weights)')
    parser.add_argument('--weights', help="checkpoint file (mmdet's spelling of CHECKPOINT)")
    parser.add_argument('--out-dir', default='outputs', help='where vis/ and the predictions go')
    parser.add_argument('--device', default='cpu', help="'cpu' or e.g. 'cuda:0'")
    parser.add_argument(
        '--pred-score-thr', type=float, help='detection: paint boxes above this score (0.3)'
    )
    parser.add_argument('--opacity', type=float, help='segmentation: mask opacity in (0, 1] (0.5)')
    parser.add_argument(
        '--palette',
        choices=['coco', 'voc', 'citys', 'random'],
        help="detection: the boxes' colours (default: the config dataset's)",
    )
    parser.add_argument('--show', action='store_true', help='show each painted image in a window')
    parser.add_argument(
        '--wait-time', type=float, default=0, help='seconds per shown image (0: a key)'
    )
    parser.add_argument('--no-save-vis', action='store_true', help='write no painted image')
    parser.add_argument('--no-save-pred', action='store_true', help='write no prediction file')
    parser.add_argument('--print-result', action='store_true', help='print the predictions')
    add_trust_flag(parser)
    add_partial_weights_flag(parser)
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.weights is None):
        parser.error('give the checkpoint once: CHECKPOINT or --weights')
    args.checkpoint = args.checkpoint or args.weights
    return args


def image_files(inputs: str):
    """The image files of ``inputs``: the file itself, or a folder's image files (by
    :data:`IMG_EXTENSIONS`, sorted; not its subfolders)."""
    if osp.isfile(inputs):
        return [inputs]
    if not osp.isdir(inputs):
        raise CLIError(f'inputs {inputs}: no such file or folder')
    files = sorted(
        osp.join(inputs, name)
        for name in os.listdir(inputs)
        if name.lower().endswith(IMG_EXTENSIONS) and osp.isfile(osp.join(inputs, name))
    )
    if not files:
        raise CLIError(f'inputs {inputs}: no image file ({", ".join(IMG_EXTENSIONS)}) in it')
    return files


def _targets(index: int, path: str, scope: str, args):
    """The files the ``scope`` Inferencer writes for the ``index``-th input ``path``."""
    name = osp.basename(path)
    vis = [] if args.no_save_vis else [osp.join('vis', name)]
    if scope == 'mmseg':
        return vis + [osp.join('pred', f'{index:08d}_pred.png')]
    return vis + ([] if args.no_save_pred else [osp.join('preds', osp.splitext(name)[0] + '.json')])


def output_files(files, scope: str, args):
    """``{input: the files the Inferencer writes for it}``; two inputs that would write
    the same file, or a file that exists, is a one-line :class:`CLIError`."""
    outputs, written = {}, {}
    for index, path in enumerate(files):
        written[path] = []
        for target in _targets(index, path, scope, args):
            target = osp.join(args.out_dir, target)
            if target in outputs:
                raise CLIError(
                    f'{outputs[target]} and {path} would both write {target}: give one of them'
                )
            if osp.lexists(target):
                raise CLIError(f'{target} exists: give another --out-dir (nothing is overwritten)')
            outputs[target] = path
            written[path].append(target)
    return written


def _check_flags(scope: str, args) -> None:
    """Flags of the other library are refused; values in their ranges."""
    if scope not in INFERENCERS:
        raise CLIError(
            f'config {args.config}: default_scope {scope!r}: the demo takes mmdet or mmseg'
        )
    for dest, library in OWN_FLAGS.items():
        if library != scope and getattr(args, dest) not in (None, False):
            flag = '--' + dest.replace('_', '-')
            raise CLIError(f"{flag} is {library}'s; {args.config} is an {scope} config")
    if args.opacity is not None and not 0 < args.opacity <= 1:
        raise CLIError(f'--opacity must be in (0, 1], got {args.opacity}')
    if args.pred_score_thr is not None and not 0 <= args.pred_score_thr <= 1:
        raise CLIError(f'--pred-score-thr must be in [0, 1], got {args.pred_score_thr}')
    if args.wait_time < 0:
        raise CLIError(f'--wait-time must be >= 0, got {args.wait_time}')


def inferencer(scope: str, args):
    """The library's Inferencer on ``args.config`` whose model is
    :func:`mmcirc.apis.build_model`'s (the checkpoint checked to fit it)."""
    import importlib

    from mmcirc.apis import build_model

    module, name = INFERENCERS[scope].rsplit('.', 1)
    base = getattr(importlib.import_module(module), name)
    allow_partial, palette = args.allow_partial_weights, args.palette

    class Checked(base):
        def _init_model(self, cfg, weights, device='cpu'):
            model = build_model(
                cfg, weights, device, warn_random=True, allow_partial_weights=allow_partial
            )
            if palette is not None:  # mmdet's --palette (its Inferencer's priority)
                model.dataset_meta['palette'] = palette
            return model

    return Checked(model=args.config, weights=args.checkpoint, device=args.device)


@main_guard
def main(argv=None):
    one_line_warnings('build_loss', 'avg_non_ignore', 'please provide the `save_dir`')
    args = parse_args(argv)
    check_config_file(args.config, args.checkpoint)
    check_device(args.device)
    from mmcirc.apis.builder import load_model_config

    with as_cli_errors():
        scope = load_model_config(args.config).default_scope
    _check_flags(scope, args)
    check_output_dir(args.out_dir, '--out-dir')
    files = image_files(args.inputs)
    written = output_files(files, scope, args)
    show = show_or_warn(args.show, '--out-dir DIR')
    trust_if_asked(args)
    with refused_checkpoints('--trust-checkpoint'), as_cli_errors():
        model = inferencer(scope, args)
    call = dict(show=show, wait_time=args.wait_time, out_dir=args.out_dir)
    if scope == 'mmdet':
        thr = 0.3 if args.pred_score_thr is None else args.pred_score_thr
        call.update(pred_score_thr=thr, print_result=args.print_result)
        call.update(no_save_vis=args.no_save_vis, no_save_pred=args.no_save_pred)
    else:
        call['opacity'] = 0.5 if args.opacity is None else args.opacity
    model(files, **call)
    for path, targets in written.items():
        print(f'{path} -> {", ".join(targets) or "(nothing written)"}')
