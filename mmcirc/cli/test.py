"""``tools/test.py``: evaluate a checkpoint on an mmdet, mmseg or mmpretrain config's test
set, with mmdet's command line (``--show``, ``--show-dir``, ``--wait-time``, ``--tta``,
``--out``); the backbone overrides are written into the config before the model is built."""

import argparse
import os.path as osp

from mmcirc.apis.overrides import apply_backbone_overrides
from mmcirc.apis.weights import WeightsFitHook
from mmcirc.cli.common import (
    CLIError,
    add_compile_flag,
    add_override_args,
    add_partial_weights_flag,
    add_trust_flag,
    main_guard,
    one_line_warnings,
    overrides_from_args,
    refused_checkpoints,
    show_or_warn,
    trust_if_asked,
)
from mmcirc.cli.runner import build_runner, load_config, parse_run_args, run_and_release
from mmcirc.engine.compile import add_compile_hook


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (and evaluate) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--out',
        help='dump predictions to this file (.pkl for mmdet and '
        'mmpretrain; a directory of label PNGs for mmseg)',
    )
    parser.add_argument(
        '--show',
        action='store_true',
        help='show the painted predictions in a window (none without a display)',
    )
    parser.add_argument(
        '--show-dir',
        help='save painted predictions under '
        'work_dir/<timestamp>/<show_dir> (mmdet) or this directory',
    )
    parser.add_argument(
        '--wait-time', type=float, default=2, help='seconds each shown image stays (--show)'
    )
    parser.add_argument(
        '--tta',
        action='store_true',
        help="test-time augmentation: the config's tta_pipeline and tta_model",
    )
    add_compile_flag(parser)
    add_trust_flag(parser)
    add_partial_weights_flag(parser)
    add_override_args(parser)
    return parse_run_args(parser, argv)


def _mmdet_outputs(cfg, args):
    from mmdet.engine.hooks.utils import trigger_visualization_hook

    if args.show or args.show_dir:
        cfg = trigger_visualization_hook(cfg, args)
    return cfg


def _mmseg_outputs(cfg, args):
    if args.show or args.show_dir:
        cfg.default_hooks.visualization.draw = True
    if args.show:
        cfg.default_hooks.visualization.update(show=True, wait_time=args.wait_time)
    if args.show_dir:
        cfg.visualizer.save_dir = args.show_dir
    if args.out:
        cfg.test_evaluator.output_dir = args.out
        cfg.test_evaluator.keep_results = True
    return cfg


def _mmpretrain_outputs(cfg, args):
    if args.show or args.show_dir:
        cfg.default_hooks.visualization.enable = True
    if args.show:
        cfg.default_hooks.visualization.update(show=True, wait_time=args.wait_time)
    if args.show_dir:
        cfg.default_hooks.visualization.out_dir = args.show_dir
    return cfg


def _test_time_aug(cfg, config: str) -> None:
    """``--tta``: the config's ``tta_model`` wraps its model and its ``tta_pipeline``
    feeds the test set, as mmdet's and mmseg's ``test.py`` do; a config without them is
    a one-line :class:`CLIError`."""
    from mmengine.config import ConfigDict

    missing = [key for key in ('tta_model', 'tta_pipeline') if not cfg.get(key)]
    if missing:
        raise CLIError(
            f'--tta: {config} has no {" and no ".join(missing)} (the test-time augmentation '
            f"to run: as in {cfg.default_scope}'s *_tta.py configs)"
        )
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline


def _dump_metric(scope, out):
    """The metric that pickles raw predictions (mmseg writes PNGs via output_dir)."""
    if scope == 'mmdet':
        from mmdet.evaluation import DumpDetResults

        return DumpDetResults(out_file_path=out)
    from mmengine.evaluator import DumpResults

    return DumpResults(out_file_path=out)


OUTPUTS = dict(mmdet=_mmdet_outputs, mmseg=_mmseg_outputs, mmpretrain=_mmpretrain_outputs)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    one_line_warnings()
    if not osp.isfile(args.checkpoint):
        raise CLIError(f'checkpoint file not found: {args.checkpoint}')
    cfg = load_config(args.config, args.cfg_options, args.work_dir, args.launcher)
    apply_backbone_overrides(cfg, overrides_from_args(args))
    trust_if_asked(args)
    scope = cfg.default_scope
    if args.out and scope != 'mmseg' and not args.out.endswith(('.pkl', '.pickle')):
        raise CLIError(f'--out {args.out}: {scope} predictions are dumped to a .pkl file')
    cfg.load_from = args.checkpoint
    if args.compile:
        add_compile_hook(cfg, args.compile)
    args.show = show_or_warn(args.show, '--show-dir DIR')
    cfg = OUTPUTS[scope](cfg, args)
    if args.tta:
        _test_time_aug(cfg, args.config)
    runner = build_runner(cfg)
    if args.out and scope != 'mmseg':
        runner.test_evaluator.metrics.append(_dump_metric(scope, args.out))
    # the checkpoint must fit the model before anything is scored (or loads in part with
    # the flag, and a warning line)
    runner.register_hook(WeightsFitHook('test', args.checkpoint, args.allow_partial_weights))
    with refused_checkpoints('--trust-checkpoint'):
        return run_and_release(runner, 'test')
