"""Whole-image semantic segmentation at high resolution (e.g. 4096 x 4096) with an
mmseg config, timing it and measuring its peak memory: the command behind
``tools/infer_highres.py`` (its entry point): its flags, their checks, warnings as one
line, the progress bar, the one ``error:`` line and the exit codes.

    python tools/infer_highres.py CONFIG [CHECKPOINT] (--img PATH [PATH ...] | --demo astronaut)
        [--size S | --size HxW] [--num-cores N|mobile|edge|server] [--boundary circular|zero]
        [--scale sqrt_n|n] [--stage-attentions KIND[,KIND...]] [--out-dir work_dirs/highres]
        [--device cpu] [--opacity 0.5] [--upsample banded|mmseg] [--cfg-options k=v ...]
        [--dense-baseline | --baseline-only] [--mem-cap-gb 20] [--baseline-timeout 1800]
        [--progress | --no-progress] [--shard | --nproc P]

The segmentor is built with :func:`mmcirc.apis.build_model` after the backbone overrides are
written into the config, and runs mmseg's whole inference (``test_cfg=dict(mode='whole')``
forced, never sliding windows) on the image at the given size; see
:mod:`mmcirc.apis.highres` (the library this tool is the command line of). Without
CHECKPOINT the weights are random: only the time and memory figures mean anything.

Backbones: mmcirc's pyramids (CA-PVT, CA-Swin: every override) and isotropic models
(CA-DeiT: ``--boundary`` / ``--scale``; VECA: ``--num-cores``, C' a multiple of its
chunk of 8 within its core bank, or a preset). An override a backbone does not take is
a one-line error naming what it takes.

Per image, under --out-dir (written atomically; the JSON last):
``<name>_<H>x<W>_<config>[_<overrides>]_{labels,mask,overlay}.png`` (class ids; the mask
coloured with the dataset palette; the mask blended over the image) and ``.json``
(time, peak RSS and its increase over the pre-inference baseline, sizes, config,
overrides, backbone). ``--dense-baseline`` also runs the dense-attention equivalent (the
same config with ``stage_attentions`` = 'sra': the original PVT) in a child process
capped with RLIMIT_AS and records whether it ran or ran out of memory, and after how long
(``--baseline-only``: only that).

Progress (mmengine's ``ProgressBar`` on stderr): one step per backbone stage (pyramids) or
block (isotropic models), the neck, the decode head and each band of classes of the
upsampling. Shown when stderr is a terminal; ``--progress`` / ``--no-progress`` force it.

Sharded (:mod:`mmcirc.parallel`): ``torchrun --nproc-per-node P
tools/infer_highres.py ... --shard`` or ``--nproc P`` (this tool starts P local gloo ranks
itself): every rank holds a band of rows of the image and of every feature map, rank 0
writes the same files (JSON: the slowest rank's time, every rank's peak RSS and bytes
sent, under ``per_rank``). CPU only; an unsupported layer is one error line before any
image is read, a P above the rows of the smallest feature map one line before inference
(naming the largest usable P); a failing rank stops all with one line and no file.

A config whose backbone keeps quadratic 'sra' stages (the paper layout) gets a WARNING
when those would not fit at the requested size: use the all-circulant / all-core configs
``configs/ca_pvt_t-allcirc_fpn_80k_ade20k.py`` / ``configs/core_pvt_t-allcore_fpn_80k_ade20k.py``.
"""

import argparse
import contextlib
import json
import os.path as osp
import re
import sys
import warnings

from mmcirc.benchmark import dense_baseline as db
from mmcirc.cli.common import CLIError, main_guard
from mmcirc.cli.override_flags import add_override_args, overrides_from_args
from mmcirc.utils import image_io as imio

#: The library's parameter names and the flags that set them (error and warning texts).
FLAGS = {
    'num_cores': '--num-cores',
    'boundary': '--boundary',
    'scale': '--scale',
    'stage_attentions': '--stage-attentions',
    'upsample': '--upsample',
}


def flag_words(message: str) -> str:
    """A library message that starts with a parameter name (``num_cores must ...``,
    ``boundary has no effect ...``) -> the same with the flag (``--num-cores must ...``)."""
    m = re.match(r'(\w+)\b', message)
    if m and m.group(1) in FLAGS:
        return FLAGS[m.group(1)] + message[m.end() :]
    return message


@contextlib.contextmanager
def as_cli_errors():
    """The library's ValueError / TypeError -> one-line :class:`CLIError` in flag words."""
    try:
        yield
    except (ValueError, TypeError) as err:
        raise CLIError(
            flag_words(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
        ) from None


def parse_args(argv=None):
    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(
        description='High-resolution whole-image segmentation: masks, overlays, time and memory'
    )
    parser.add_argument('config', help='mmseg config file')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint (omit: random weights)')
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument('--img', nargs='+', metavar='PATH', help='image file(s)')
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
        dest='progress',
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
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, help='override config settings, key=value'
    )
    parser.add_argument(
        '--compile',
        nargs='?',
        const='inductor',
        metavar='BACKEND',
        help="torch.compile the backbone's forward (BACKEND: torch.compile's, default "
        'inductor); one process only',
    )
    shard = parser.add_mutually_exclusive_group()
    shard.add_argument(
        '--shard', action='store_true', help='one rank of a torchrun group (sharded inference)'
    )
    shard.add_argument('--nproc', type=int, help='sharded inference on P local processes')
    return parser.parse_args(argv)


def _one_line_warnings():
    """Print warnings as one line (``WARNING: message``, in flag words), without library noise."""
    warnings.filterwarnings('ignore', category=DeprecationWarning)
    warnings.filterwarnings('ignore', message='.*pkg_resources.*')
    for noise in ('Checkpoint is not loaded', 'build_loss', 'avg_non_ignore'):
        warnings.filterwarnings('ignore', message=f'.*{noise}.*')

    def show(message, category, filename, lineno, file=None, line=None):
        print(f'WARNING: {flag_words(str(message))}', file=sys.stderr, flush=True)

    warnings.showwarning = show


class ProgressReporter:
    """``progress(what, done, total)`` for :func:`mmcirc.apis.highres.predict_labels`:
    one mmengine ``ProgressBar`` on stderr per image, ended with a newline."""

    def __init__(self, file=None):
        self.file = file or sys.stderr
        self.bar = None

    def __call__(self, what: str, done: int, total: int) -> None:
        from mmengine.utils import ProgressBar

        if self.bar is None:
            self.bar = ProgressBar(total, file=self.file)
        self.bar.update()
        if done == total:
            self.file.write('\n')
            self.file.flush()
            self.bar = None


def _load_images(args, size):
    """[(name, image BGR uint8 at the target size, source (H, W), source)] ; every
    image is read before anything runs, so a bad path fails with no output."""
    if args.demo is not None:
        src = [(args.demo, imio.demo_image(args.demo), f'skimage.data.{args.demo}()')]
    else:
        src = [(osp.splitext(osp.basename(p))[0], imio.read_image(p), p) for p in args.img]
    return [(name, imio.resize_image(img, size), img.shape[:2], where) for name, img, where in src]


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
    if args.device.startswith('cuda'):
        import torch

        if not torch.cuda.is_available():
            raise CLIError(f'--device {args.device}: CUDA is not available here')
    elif args.device != 'cpu':
        raise CLIError(f"--device must be 'cpu' or 'cuda[:N]', got {args.device!r}")
    if args.checkpoint is not None and not osp.isfile(args.checkpoint):
        raise CLIError(f'checkpoint file not found: {args.checkpoint}')
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
    _one_line_warnings()
    args = parse_args(argv)
    from mmcirc import apis
    from mmcirc.analysis.attention_memory import quadratic_warning
    from mmcirc.utils.memory import is_out_of_memory

    with as_cli_errors():
        overrides = overrides_from_args(args)
    size = _check_args(args)
    if args.shard or args.nproc is not None:
        return _main_sharded(args, overrides, size)
    images = _load_images(args, size)
    with as_cli_errors():
        cfg = apis.load_highres_config(args.config, args.cfg_options, overrides)
        minimum = apis.min_input_size(cfg)
    cfg_name = osp.splitext(osp.basename(args.config))[0]
    for name, img, _, _ in images:
        if min(img.shape[:2]) < minimum:
            raise CLIError(
                f'image {name} is {img.shape[0]}x{img.shape[1]}: {cfg_name} needs at '
                f'least {minimum}x{minimum} (use --size)'
            )
    if args.dense_baseline or args.baseline_only:
        db.dense_attention(cfg)  # a one-line error before anything runs

    # the dense baselines first, while this process is still small
    dense = {}
    if args.dense_baseline or args.baseline_only:
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
                h, w = img.shape[:2]
                kinds = '-'.join(sorted(set(d.get('stage_attentions') or ['dense'])))
                stem = apis.output_stem(args.out_dir, name, (h, w), args.config, overrides)
                path = f'{stem}_dense-{kinds}.json'
                imio.write_atomic({path: json.dumps(d, indent=2).encode()})
    if args.baseline_only:
        return 0

    model = apis.build_model(cfg, args.checkpoint, device=args.device, warn_random=True)
    if args.compile is not None:  # the backbone: where the attention runs
        import torch

        backbone = apis.image_backbone(model)
        backbone.forward = torch.compile(backbone.forward, backend=args.compile)
    palette = model.dataset_meta['palette']
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    for name, img, source_size, where in images:
        h, w = img.shape[:2]
        warn = quadratic_warning(apis.image_backbone(model), (h, w))
        if warn:
            print(warn, file=sys.stderr, flush=True)
        try:
            labels, rec = apis.run_image(
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
        base = apis.output_stem(args.out_dir, name, (h, w), args.config, overrides)
        apis.write_result(base, rec, img, labels, palette, args.opacity)
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


def _sharded_rank(args, overrides, size):
    """One rank of ``--shard`` / ``--nproc``: build, shard (errors before any image),
    predict each image band-wise; rank 0 writes the files and returns its lines."""
    import torch.distributed as dist

    from mmcirc import apis
    from mmcirc.parallel import infer as pinf
    from mmcirc.distributed.comm import group_rank_size
    from mmcirc.parallel.model import check_size, shard_model

    rank, world = group_rank_size()
    with as_cli_errors():
        cfg = apis.load_highres_config(args.config, args.cfg_options, overrides)
        model = apis.build_model(cfg, args.checkpoint, device='cpu', warn_random=rank == 0)
        backbone = apis.backbone_summary(apis.image_backbone(model))
        sharded = shard_model(model)  # an unsupported layer: ValueError, nothing read yet
    pinf.sync_weights(model)  # random weights: rank 0's everywhere
    images = _load_images(args, size) if rank == 0 else None
    meta = [[(n, i.shape[:2], s, w) for n, i, s, w in images] if rank == 0 else None]
    dist.broadcast_object_list(meta, 0)
    lines = []
    for k, (name, hw, source_size, where) in enumerate(meta[0]):
        with as_cli_errors():
            check_size(model, hw, world)
        img = images[k][1] if rank == 0 else None
        labels, rec = pinf.run_image_sharded(sharded, img, hw)
        if rank != 0:
            continue
        rec = apis.HighResResult(
            image=where, input_size=list(hw), source_size=list(source_size), config=args.config,
            checkpoint=args.checkpoint, random_weights=args.checkpoint is None,
            overrides=dict(overrides), backbone=backbone, device='cpu', sharded=True, **rec,
            num_classes=len(model.dataset_meta['classes']),
            labels_present=int(len(set(labels.ravel().tolist()))),
        )  # fmt: skip
        base = apis.output_stem(args.out_dir, name, hw, args.config, overrides)
        apis.write_result(
            base, rec, images[k][1], labels, model.dataset_meta['palette'], args.opacity
        )
        lines.append(
            f'{name} {hw[0]}x{hw[1]} | {backbone["type"]} sharded over {world} ranks | '
            f'{rec.time_s:.2f} s | peak RSS per rank '
            + ', '.join(f'{r["peak_rss_mb"] / 1024:.2f}' for r in rec.per_rank)
            + f' GB | {rec.bytes_sent / MB_:.1f} MB sent | {base}_overlay.png'
        )
    return lines


MB_ = 1024**2


def _main_sharded(args, overrides, size):
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
        threads = max(1, torch.get_num_threads() // args.nproc)
        try:
            lines = run_parallel(
                _sharded_rank, args.nproc, (args, overrides, size), threads=threads
            )[0]
        except RuntimeError as err:  # 'rank r failed: <its error>'
            raise CLIError(str(err).strip().splitlines()[0]) from None
    else:
        from mmcirc.distributed.comm import group_rank_size
        from mmcirc.distributed.launch import init_from_env, is_secondary_error, leaving_group

        init_from_env('gloo')
        rank = group_rank_size()[0]
        try:
            with leaving_group():  # without it a finished rank can abort in teardown
                lines = _sharded_rank(args, overrides, size)
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
