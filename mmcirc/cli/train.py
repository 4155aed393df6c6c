"""``tools/train.py``: train an mmdet, mmseg or mmpretrain config (the library comes from
its ``default_scope``)."""

import argparse
import contextlib
import logging
import sys

from mmengine.logging import print_log

from mmcirc.apis.weights import WeightsFitHook
from mmcirc.cli.common import CLIError, add_compile_flag, main_guard
from mmcirc.cli.runner import build_runner, load_config, parse_run_args, run_and_release
from mmcirc.engine.compile import add_compile_hook


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model with mmcirc backbones')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision')
    add_compile_flag(parser, "; mmengine's whole train step: --cfg-options compile.backend=BACKEND")
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the LR by the actual batch size (auto_scale_lr)',
    )
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from CKPT, or from the latest checkpoint in work_dir if no path '
        '(none there: train from scratch, so a job restarted by torchrun starts alike)',
    )
    parser.add_argument(
        '--shard',
        action='store_true',
        help='spatially sharded training (mmseg EncoderDecoder): every rank of the '
        'torchrun world computes one band of rows of every sample; the loss, gradients '
        "and updates are one process's (mmcirc.distributed.segmentor.train.SpatialParallel)",
    )
    parser.add_argument(
        '--shard-size',
        type=int,
        metavar='S',
        help='with --shard: S ranks per spatial group, the W ranks as W / S data-parallel '
        'groups, each reading its own samples (default: the whole world, one group)',
    )
    return parse_run_args(parser, argv)


def enable_amp(cfg):
    wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if wrapper == 'AmpOptimWrapper':
        print_log(
            'AMP training is already enabled in the config.',
            logger='current',
            level=logging.WARNING,
        )
        return
    if wrapper != 'OptimWrapper':
        raise CLIError(f'--amp needs optim_wrapper.type=OptimWrapper, got {wrapper!r}')
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.loss_scale = 'dynamic'


def sharded_config(cfg) -> bool:
    """Whether the config asks for spatially sharded training (its model wrapper)."""
    return (cfg.get('model_wrapper_cfg') or {}).get('type') == 'SpatialParallel'


def shard(cfg, args):
    """``--shard`` (``--shard-size S``: S ranks per spatial group): the config made
    spatially sharded (:func:`mmcirc.distributed.segmentor.train.shard_config`); a
    distributed launch is required."""
    from mmcirc.distributed.segmentor.train import shard_config

    if cfg.launcher == 'none':
        raise CLIError(
            '--shard needs a distributed launch: torchrun --nproc-per-node P '
            'tools/train.py CONFIG --launcher pytorch --shard'
        )
    if args.auto_scale_lr:
        raise CLIError('--shard and --auto-scale-lr: the ranks share one batch')
    if args.shard_size is not None and args.shard_size < 1:
        raise CLIError(f'--shard-size must be a positive int, got {args.shard_size}')
    shard_config(cfg, args.shard_size)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options, args.work_dir, args.launcher)
    if args.amp:
        enable_amp(cfg)
    if args.compile:
        add_compile_hook(cfg, args.compile)
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            raise CLIError(f'{args.config}: --auto-scale-lr needs auto_scale_lr.base_batch_size')
        cfg.auto_scale_lr.enable = True
    if args.resume is not None:
        cfg.resume, cfg.load_from = True, resume_from(cfg.work_dir, args.resume)
    if args.shard or sharded_config(cfg):
        shard(cfg, args)
    elif args.shard_size is not None:
        raise CLIError('--shard-size needs --shard')
    with work_dir_lock(cfg):
        runner = build_runner(cfg)
        # weights that do not fit: load_from's or init_cfg's backbone of another model,
        # a resume into a changed model or with nothing left to train: one line
        mode = 'resume' if cfg.get('resume') else 'train'
        runner.register_hook(WeightsFitHook(mode, cfg.get('load_from')))
        run_and_release(runner, 'train')


def work_dir_lock(cfg):
    """One run per work dir: the global rank 0 of the job holds the work dir's lock
    (:class:`mmcirc.engine.WorkDirLock`) while it trains; a work dir another run holds
    is a one-line error. The other ranks take nothing."""
    from mmcirc.engine import WorkDirBusyError, WorkDirLock, launcher_rank

    if launcher_rank(cfg.launcher) != 0:
        return contextlib.nullcontext()
    try:
        return WorkDirLock(cfg.work_dir).acquire()
    except WorkDirBusyError as err:
        raise CLIError(str(err)) from None


def resume_from(work_dir, resume):
    """The checkpoint ``--resume`` continues from: the given one, or the newest in
    ``work_dir``; one that does not load is skipped, with a warning naming both."""
    from mmcirc.engine import find_resumable_checkpoint

    try:
        path, skipped = find_resumable_checkpoint(work_dir, None if resume == 'auto' else resume)
    except FileNotFoundError as err:
        raise CLIError(f'--resume: {err}') from None
    for bad, why in skipped:
        print(
            f'warning: --resume: cannot load {bad} ({why}); resuming from {path} instead',
            file=sys.stderr,
            flush=True,
        )
    return path
