"""``tools/infer_highres.py --shard`` (this process is one torchrun rank) and ``--nproc P``
(this tool starts P local gloo ranks itself): sharded whole-image inference
(:mod:`mmcirc.distributed.segmentor`), the flags and messages of :mod:`mmcirc.cli.infer_highres`.

Every rank holds a band of rows of the image and of every feature map, rank 0 writes the
same files (JSON: the slowest rank's time, every rank's peak RSS and bytes sent, under
``per_rank``). CPU only; an unsupported layer is one error line before any image is read,
a P above the rows of the smallest feature map one line before inference (naming the
largest usable P); a failing rank stops all with one line and no file.
"""

import sys

from mmcirc.cli.common import CLIError, refused_checkpoints
from mmcirc.cli.override_flags import as_cli_errors
from mmcirc.utils import image_io as imio
from mmcirc.utils.memory import MB

__all__ = ['main_sharded']


def _rank(args, overrides, size):
    """One rank of ``--shard`` / ``--nproc``: build, shard (errors before any image),
    predict each image band-wise; rank 0 writes the files and returns its lines."""
    import torch.distributed as dist

    from mmcirc import apis
    from mmcirc.distributed.comm import group_rank_size
    from mmcirc.distributed.segmentor import infer as pinf
    from mmcirc.distributed.segmentor.model import check_size, shard_model

    rank, world = group_rank_size()
    if args.trust_checkpoint and args.checkpoint is not None:  # this process's loader
        from mmcirc.engine import trust_checkpoint

        trust_checkpoint(args.checkpoint)
    with as_cli_errors(), refused_checkpoints('--trust-checkpoint'):
        cfg = apis.load_highres_config(args.config, args.cfg_options, overrides)
        model = apis.build_model(
            cfg,
            args.checkpoint,
            device='cpu',
            warn_random=rank == 0,
            allow_partial_weights=args.allow_partial_weights,
        )
        backbone = apis.backbone_summary(apis.image_backbone(model))
        sharded = shard_model(model)  # an unsupported layer: ValueError, nothing read yet
    pinf.sync_weights(model)  # random weights: rank 0's everywhere
    images = imio.load_images(args.img, args.demo, size) if rank == 0 else None
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
            checkpoint=args.checkpoint, random_weights=apis.has_random_weights(model),
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
            + f' GB | {rec.bytes_sent / MB:.1f} MB sent | {base}_overlay.png'
        )
    return lines


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
