"""Whole-image semantic segmentation at high resolution with an mmseg config, timed and
its peak memory measured (mmseg's whole inference, never sliding windows:
:mod:`mmcirc.apis.highres`). Without CHECKPOINT the weights are random: only the time and
memory figures mean anything.

Per image, under --out-dir: label, mask and overlay PNGs and a JSON record
(:mod:`.infer_highres_record`); ``--dense-baseline`` also runs the dense-attention
equivalent in a memory-capped child (:mod:`.infer_highres_dense`). ``--shard`` (this
process is one torchrun rank) and ``--nproc P`` (P local gloo ranks) run sharded inference
(:mod:`mmcirc.distributed.segmentor`, :func:`main_sharded`): the same files, a failing rank
stops all with one line and no file.
"""

import argparse
import json
import math
import os.path as osp
import sys

from mmcirc.cli import infer_highres_dense as db
from mmcirc.cli import infer_highres_record as rec_io
from mmcirc.cli.common import (
    Accumulate,
    CLIError,
    add_cfg_options,
    add_compile_flag,
    add_override_args,
    add_partial_weights_flag,
    add_trust_flag,
    as_cli_errors,
    check_config_file,
    check_device,
    check_output_dir,
    flag_words,
    main_guard,
    one_line_warnings,
    overrides_from_args,
    refused_checkpoints,
    trust_if_asked,
)
from mmcirc.cli import image_io as imio
from mmcirc.utils.fileio import atomic_write
from mmcirc.utils.memory import MB


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='High-resolution whole-image segmentation: masks, overlays, time and memory'
    )
    parser.add_argument('config', help='mmseg config file')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint (omit: random weights)')
    add_partial_weights_flag(parser)  # the record then says random_weights: true
    add_trust_flag(parser)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        '--img', nargs='+', action=Accumulate, metavar='PATH', help='image file(s), repeatable'
    )
    src.add_argument(
        '--demo',
        metavar='NAME',
        help="scikit-image sample: 'astronaut' "
        "(also 'chelsea', 'coffee'), bicubic-resized to --size",
    )
    parser.add_argument(
        '--size',
        help='S: resize the longer side to S (aspect kept); HxW: exact '
        'size; omitted: the image as it is',
    )
    add_override_args(parser)
    parser.add_argument('--out-dir', default='work_dirs/highres', help='output folder')
    parser.add_argument('--device', default='cpu', help="'cpu' or e.g. 'cuda:0'")
    parser.add_argument('--opacity', type=float, default=0.5, help='mask opacity in the overlay')
    parser.add_argument(
        '--upsample',
        default='banded',
        help="'banded' (default: mmseg's resize "
        "+ argmax over bands of classes, same labels, bounded memory) or 'mmseg' "
        "(the segmentor's own test_step, full-resolution logits)",
    )
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument(
        '--progress',
        action='store_true',
        default=None,
        help='progress bar on stderr (a step per backbone stage or block, the neck, the '
        'decode head, each upsampling band); default: on when stderr is a terminal',
    )
    bar.add_argument('--no-progress', dest='progress', action='store_false', help='no progress bar')
    base = parser.add_mutually_exclusive_group()
    base.add_argument(
        '--dense-baseline',
        action='store_true',
        help='also run the dense-attention '
        "equivalent (stage_attentions='sra') in a memory-capped child process",
    )
    base.add_argument('--baseline-only', action='store_true', help='run only the dense baseline')
    parser.add_argument(
        '--mem-cap-gb',
        type=float,
        default=20.0,
        help='RLIMIT_AS of the dense-baseline child in GiB (20)',
    )
    parser.add_argument(
        '--baseline-timeout',
        type=float,
        default=1800,
        help='seconds before the dense-baseline child is killed (1800)',
    )
    add_cfg_options(parser)
    add_compile_flag(parser, '; one process only')
    shard = parser.add_mutually_exclusive_group()
    shard.add_argument(
        '--shard', action='store_true', help='one rank of a torchrun group (sharded inference)'
    )
    shard.add_argument('--nproc', type=int, help='sharded inference on P local processes')
    parser.add_argument(
        '--shard-size',
        type=int,
        metavar='S',
        help='with --shard / --nproc: S ranks per image, the ranks as groups of S that '
        'predict their share of the images at once (default: every rank on each image)',
    )
    return parser.parse_args(argv)


class ProgressReporter:
    """``progress(what, done, total)`` for :func:`mmcirc.apis.highres.predict_labels`:
    one mmengine ``ProgressBar`` on stderr per image, ended with a newline."""

    bar = None

    def __call__(self, what: str, done: int, total: int) -> None:
        from mmengine.utils import ProgressBar

        if self.bar is None:
            self.bar = ProgressBar(total, file=sys.stderr)
        self.bar.update()
        if done == total:
            print(file=sys.stderr, flush=True)
            self.bar = None


def _dense_line(name, hw, d):
    kinds = '-'.join(d.get('stage_attentions') or ['?'])
    head = f'{name} {hw[0]}x{hw[1]} | dense baseline {kinds}, RLIMIT_AS {d["mem_cap_gb"]:g} GB |'
    if d['status'] == 'ok':
        return f'{head} ran in {d["time_s"]:.2f} s | peak RSS {d["peak_rss_mb"] / 1024:.2f} GB'
    t = d.get('time_s')
    when = (
        f'after {t:.2f} s of inference' if t is not None else f'during setup ({d["wall_s"]:.1f} s)'
    )
    return f'{head} FAILED ({d["status"]}) {when} | {(d.get("error") or "")[:200]}'


def _size_advice(hw, minimum: int) -> str:
    """What ``--size`` reaches ``minimum`` on both sides of an ``hw`` image: the longer
    side S that does (aspect kept), while that stays below 16384 px, else an exact HxW."""
    short, long = min(hw), max(hw)
    s = max(minimum, math.ceil((minimum - 0.5) * long / short))
    while round(short * s / long) < minimum:
        s += 1
    if s <= 16384:
        return f'--size {s} scales its longer side to reach it, --size HxW sets both sides'
    return f'--size HxW with both sides >= {minimum} stretches it to fit'


def _check_args(args):
    """Flag checks that need no model; returns the parsed --size."""
    from mmcirc import apis

    if args.upsample not in apis.UPSAMPLE_MODES:
        raise CLIError(f'--upsample must be one of {apis.UPSAMPLE_MODES}, got {args.upsample!r}')
    if not 0 <= args.opacity <= 1:
        raise CLIError(f'--opacity must be in [0, 1], got {args.opacity}')
    if args.mem_cap_gb <= 0:
        raise CLIError(f'--mem-cap-gb must be positive, got {args.mem_cap_gb}')
    size = imio.parse_size(args.size)
    check_device(args.device)
    check_config_file(args.config, args.checkpoint)
    check_output_dir(args.out_dir, '--out-dir')
    if args.img:
        imio.output_names(args.img)  # two inputs writing the same outputs: refused now
    if args.shard_size is not None and not (args.shard or args.nproc is not None):
        raise CLIError('--shard-size needs --shard or --nproc')
    if args.compile is not None:
        import torch

        if args.shard or args.nproc is not None:
            raise CLIError('--compile runs in one process: not with --shard or --nproc')
        if args.compile not in torch.compiler.list_backends(exclude_tags=()):
            raise CLIError(
                f'--compile must be a torch.compile backend such as '
                f'{tuple(torch.compiler.list_backends())}, got {args.compile!r}'
            )
    return size


@main_guard
def main(argv=None):
    one_line_warnings(
        'Checkpoint is not loaded', 'build_loss', 'avg_non_ignore', wording=flag_words
    )
    args = parse_args(argv)
    from mmcirc import apis
    from mmcirc.analysis.attention_memory import quadratic_warning
    from mmcirc.utils.memory import is_out_of_memory

    with as_cli_errors():
        overrides = overrides_from_args(args)
        size = _check_args(args)
    trust_if_asked(args)
    if args.shard or args.nproc is not None:
        return main_sharded(args, overrides, size)
    images = imio.load_images(args.img, args.demo, size)
    with as_cli_errors():
        cfg = apis.load_highres_config(args.config, args.cfg_options, overrides)
        minimum = apis.min_input_size(cfg)
    cfg_name = osp.splitext(osp.basename(args.config))[0]
    for name, img, _, _ in images:
        if min(img.shape[:2]) < minimum:
            raise CLIError(
                f'image {name} is {img.shape[0]}x{img.shape[1]}: {cfg_name} needs at '
                f'least {minimum}x{minimum} ({_size_advice(img.shape[:2], minimum)})'
            )
    dense = {}  # the dense baselines first, while this process is still small
    if args.dense_baseline or args.baseline_only:
        db.dense_attention(cfg)  # a one-line error before anything runs
        for name, img, _, _ in images:
            d = db.run_dense_baseline(
                args.config,
                img,
                checkpoint=args.checkpoint,
                cfg_options=args.cfg_options,
                stage_attentions=overrides.get('stage_attentions') if args.baseline_only else None,
                mem_cap_gb=args.mem_cap_gb,
                device=args.device,
                timeout=args.baseline_timeout,
                upsample=args.upsample,
            )
            d.update(image=name, config=args.config, checkpoint=args.checkpoint)
            dense[name] = d
            print(_dense_line(name, img.shape[:2], d), flush=True)
            if args.baseline_only:
                kinds = '-'.join(sorted(set(d.get('stage_attentions') or ['dense'])))
                stem = rec_io.output_stem(args.out_dir, name, img.shape[:2], args.config, overrides)
                atomic_write(f'{stem}_dense-{kinds}.json', json.dumps(d, indent=2))
    if args.baseline_only:
        return 0

    with as_cli_errors(), refused_checkpoints('--trust-checkpoint'):
        model = apis.build_model(
            cfg,
            args.checkpoint,
            device=args.device,
            warn_random=True,
            allow_partial_weights=args.allow_partial_weights,
        )
    if args.compile is not None:  # the backbone and the neck, fullgraph; the heads eager
        from mmcirc.engine.compile import compile_backbone

        compile_backbone(model, args.compile)
    palette = model.dataset_meta['palette']
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    for name, img, source_size, where in images:
        h, w = img.shape[:2]
        warn = quadratic_warning(apis.image_backbone(model), (h, w))
        if warn:
            print(warn, file=sys.stderr, flush=True)
        try:
            labels, rec = rec_io.run_image(
                model,
                img,
                name=where,
                source_size=source_size,
                config=args.config,
                checkpoint=args.checkpoint,
                overrides=overrides,
                device=args.device,
                upsample=args.upsample,
                progress=ProgressReporter() if show_progress else None,
            )
        except (RuntimeError, MemoryError) as err:
            if not is_out_of_memory(err):
                raise
            msg = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise CLIError(f'out of memory at {h}x{w} ({name}): {db.short_error(msg)}') from None
        rec.dense_baseline = dense.get(name)
        if cfg.get('highres_replaced_test_cfg'):
            rec.test_cfg = dict(rec.test_cfg, replaced=cfg.highres_replaced_test_cfg)
        base = rec_io.output_stem(args.out_dir, name, (h, w), args.config, overrides)
        rec_io.write_result(base, rec, img, labels, palette, args.opacity)
        b = rec.backbone
        kinds = '-'.join(b.get('stage_attentions', []))
        print(
            f'{name} {h}x{w} | {b["type"]}{" " + kinds if kinds else ""}'
            f'{" C=" + str(b["num_cores"]) if "num_cores" in b else ""} | {rec.time_s:.2f} s | '
            f'peak RSS {rec.peak_rss_mb / 1024:.2f} GB (+{rec.peak_increase_mb / 1024:.2f} GB over '
            f'{rec.baseline_rss_mb / 1024:.2f} GB) | {base}_overlay.png',
            flush=True,
        )
    return 0


def _rank(args, overrides, size):
    """One rank of ``--shard`` / ``--nproc``: build, shard over its spatial group of
    ``--shard-size`` ranks (errors before any image), predict its group's images
    band-wise (image k: group k mod G, every group at once); each group's first rank
    writes its images' files, world rank 0 returns every image's line."""
    import torch.distributed as dist

    from mmcirc import apis
    from mmcirc.distributed.comm import data_rank, data_space_mesh, group_rank_size
    from mmcirc.distributed.segmentor import infer as pinf
    from mmcirc.distributed.segmentor.model import check_size, shard_model

    rank, world = group_rank_size()
    trust_if_asked(args)  # this process's loader
    with as_cli_errors(), refused_checkpoints('--trust-checkpoint'):
        mesh = data_space_mesh(args.shard_size)  # None: every rank on each image
        group = None if mesh is None else mesh.get_group('space')
        cfg = apis.load_highres_config(args.config, args.cfg_options, overrides)
        model = apis.build_model(
            cfg,
            args.checkpoint,
            device='cpu',
            warn_random=rank == 0,
            allow_partial_weights=args.allow_partial_weights,
        )
        backbone = apis.backbone_summary(apis.image_backbone(model))
        sharded = shard_model(model, group)  # an unsupported layer: ValueError, nothing read yet
    pinf.sync_weights(model)  # random weights: rank 0's everywhere
    images = imio.load_images(args.img, args.demo, size) if rank == 0 else None
    meta = [[(n, i.shape[:2], s, w) for n, i, s, w in images] if rank == 0 else None]
    dist.broadcast_object_list(meta, 0)
    d, groups = data_rank(args.shard_size)
    ranks = world // groups
    for _, hw, _, _ in meta[0]:  # every rank refuses alike, before any image
        with as_cli_errors():
            check_size(model, hw, ranks)
    mine = pinf.share_images(
        [i for _, i, _, _ in images] if rank == 0 else None,
        [hw for _, hw, _, _ in meta[0]],
        args.shard_size,
    )
    lines = {}
    for k in range(d, len(meta[0]), groups):
        name, hw, source_size, where = meta[0][k]
        labels, rec = pinf.run_image_sharded(sharded, mine.get(k), hw, group)
        if k not in mine:
            continue
        rec = rec_io.HighResResult(
            image=where, input_size=list(hw), source_size=list(source_size), config=args.config,
            checkpoint=args.checkpoint, random_weights=apis.has_random_weights(model),
            overrides=dict(overrides), backbone=backbone, device='cpu', sharded=True, **rec,
            num_classes=len(model.dataset_meta['classes']),
            labels_present=int(len(set(labels.ravel().tolist()))),
        )  # fmt: skip
        base = rec_io.output_stem(args.out_dir, name, hw, args.config, overrides)
        rec_io.write_result(base, rec, mine[k], labels, model.dataset_meta['palette'], args.opacity)
        lines[k] = (
            f'{name} {hw[0]}x{hw[1]} | {backbone["type"]} sharded over {ranks} ranks | '
            f'{rec.time_s:.2f} s | peak RSS per rank '
            + ', '.join(f'{r["peak_rss_mb"] / 1024:.2f}' for r in rec.per_rank)
            + f' GB | {rec.bytes_sent / MB:.1f} MB sent | {base}_overlay.png'
        )
    every = [None] * world if rank == 0 else None
    dist.gather_object(lines, every, dst=0)  # the groups' lines, in the images' order
    merged = {k: v for g in every or () for k, v in g.items()}
    return [merged[k] for k in sorted(merged)]


def main_sharded(args, overrides, size):
    """``--shard`` (this process is one torchrun rank) or ``--nproc P`` (start P ranks)."""
    if args.dense_baseline or args.baseline_only or args.upsample != 'banded':
        raise CLIError('--shard/--nproc: no --dense-baseline/--baseline-only/--upsample mmseg')
    if args.device != 'cpu':
        raise CLIError('--shard/--nproc run on the CPU (gloo) only')
    if args.nproc is not None:
        import torch

        from mmcirc.distributed import run_parallel

        if args.nproc < 1:
            raise CLIError(f'--nproc must be a positive int, got {args.nproc}')
        if args.shard_size is not None and (args.shard_size < 1 or args.nproc % args.shard_size):
            raise CLIError(f'--shard-size must divide --nproc {args.nproc}, got {args.shard_size}')
        threads = max(1, torch.get_num_threads() // args.nproc)
        try:
            lines = run_parallel(_rank, args.nproc, (args, overrides, size), threads=threads)[0]
        except RuntimeError as err:  # 'rank r failed: <its error>'
            raise CLIError(str(err).strip().splitlines()[0]) from None
    else:
        from mmcirc.distributed.comm import group_rank_size
        from mmcirc.distributed.launch import init_from_env, is_secondary_error, leaving_group

        init_from_env('gloo')
        rank = group_rank_size()[0]
        try:
            with leaving_group():  # without it a finished rank can abort in teardown
                lines = _rank(args, overrides, size)
        except (CLIError, ValueError, TypeError):
            if rank != 0:  # the same error on every rank: rank 0 reports it
                sys.exit(1)
            raise
        except Exception as err:  # one line from the failing rank; its peers' echoes quiet
            msg = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            if is_secondary_error(msg):
                sys.exit(1)
            raise CLIError(f'rank {rank} failed: {type(err).__name__}: {msg}') from None
    for line in lines:
        print(line, flush=True)
    return 0
