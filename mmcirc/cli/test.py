"""``tools/test.py``: evaluate a checkpoint on an mmdet, mmseg or mmpretrain config's test
set; the backbone overrides are written into the config before the model is built."""

import argparse
import os.path as osp

from mmcirc.apis.overrides import apply_backbone_overrides
from mmcirc.apis.weights import WeightsFitHook
from mmcirc.cli.common import (
    CLIError,
    add_override_args,
    add_partial_weights_flag,
    main_guard,
    one_line_warnings,
    overrides_from_args,
    refused_checkpoints,
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
        '--show-dir',
        help='save painted predictions under '
        'work_dir/<timestamp>/<show_dir> (mmdet) or this directory',
    )
    parser.add_argument(
        '--compile',
        nargs='?',
        const='inductor',
        metavar='BACKEND',
        help='torch.compile the backbone and the neck, fullgraph, the heads eager '
        "(mmcirc's CompileBackboneHook); default backend: inductor",
    )
    parser.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help='allow full unpickling of CHECKPOINT (only for files you trust)',
    )
    add_partial_weights_flag(parser)
    add_override_args(parser)
    return parse_run_args(parser, argv)


def _mmdet_outputs(cfg, args):
    from mmdet.engine.hooks.utils import trigger_visualization_hook

    if args.show_dir:
        args.show, args.wait_time = False, 0
        cfg = trigger_visualization_hook(cfg, args)
    return cfg


def _mmseg_outputs(cfg, args):
    if args.show_dir:
        cfg.default_hooks.visualization.draw = True
        cfg.visualizer.save_dir = args.show_dir
    if args.out:
        cfg.test_evaluator.output_dir = args.out
        cfg.test_evaluator.keep_results = True
    return cfg


def _mmpretrain_outputs(cfg, args):
    if args.show_dir:
        cfg.default_hooks.visualization.enable = True
        cfg.default_hooks.visualization.out_dir = args.show_dir
    return cfg


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
    if args.trust_checkpoint:
        from mmcirc.engine.checkpoint import trust_checkpoint

        trust_checkpoint(args.checkpoint)
    scope = cfg.default_scope
    if args.out and scope != 'mmseg' and not args.out.endswith(('.pkl', '.pickle')):
        raise CLIError(f'--out {args.out}: {scope} predictions are dumped to a .pkl file')
    cfg.load_from = args.checkpoint
    if args.compile:
        add_compile_hook(cfg, args.compile)
    runner = build_runner(OUTPUTS[scope](cfg, args))
    if args.out and scope != 'mmseg':
        runner.test_evaluator.metrics.append(_dump_metric(scope, args.out))
    # the checkpoint must fit the model before anything is scored (or loads in part with
    # the flag, and a warning line)
    runner.register_hook(WeightsFitHook('test', args.checkpoint, args.allow_partial_weights))
    with refused_checkpoints('--trust-checkpoint'):
        return run_and_release(runner, 'test')
