"""Per-rank memory and time of sharded whole-image inference, against one process.

    python -m mmcirc.parallel.bench CONFIG [CONFIG ...] --size 2048 [--nprocs 1 2]
        [--threads 2] [--json OUT.json]

For each config and P: P local gloo ranks (``run_parallel``, P = 1 is the unsharded
segmentor in one child process), random weights (seed 0, rank 0's on every rank), the
demo image bicubic-resized to S x S. Each rank measures, after resetting its RSS
high-water mark (Linux ``clear_refs``): the backbone alone (preprocessed band in, its
bands of the stage maps out) and the whole prediction (image on rank 0 -> labels on rank
0), as the peak RSS increase over the rank's RSS just before, and the wall time; the
bytes each rank hands to torch.distributed during the prediction
(:func:`mmcirc.parallel.infer.count_bytes`). ``--threads``: torch threads of the
single process; each of P ranks gets ``max(1, threads // P)``.
"""

import argparse
import json
import sys
import time

MB = 1024**2


def _measure(fn):
    from mmcirc.utils.memory import peak_rss_bytes, reset_peak_rss, rss_bytes

    reset_peak_rss()
    base = rss_bytes()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    peak = peak_rss_bytes()
    return out, dict(
        time_s=round(dt, 3),
        peak_rss_mb=round(peak / MB, 1),
        peak_increase_mb=round((peak - base) / MB, 1),
    )


def _worker(cfg, size, sharded):
    import torch
    import torch.distributed as dist

    from mmcirc.apis import highres as hr
    from mmcirc.apis.builder import build_model
    from mmcirc.utils import image_io as imio

    from .infer import count_bytes, sync_weights
    from .model import predict_sharded, scatter_image, shard_model

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(hr.load_highres_config(cfg), seed=0)
    img = imio.resize_image(imio.demo_image('astronaut'), (size, size))
    out = dict(rank=rank)
    with torch.no_grad():
        if not sharded:
            x = model.data_preprocessor(hr._make_data(img), False)['inputs']
            feats, out['backbone'] = _measure(lambda: model.backbone(x))
            del feats
            _, out['predict'] = _measure(lambda: hr.predict_labels(model, img))
            return out
        sync_weights(model)
        s = shard_model(model)
        band = scatter_image(
            torch.from_numpy(img.transpose(2, 0, 1)).contiguous() if rank == 0 else None,
            img.shape[:2],
        )
        x = s.preprocess(band[None])
        dist.barrier()
        feats, out['backbone'] = _measure(lambda: s.backbone_feat(x))
        del feats, x, band
        dist.barrier()
        with count_bytes() as sent:
            _, out['predict'] = _measure(lambda: predict_sharded(s, img, img.shape[:2]))
        out['bytes_sent'] = dict(sent, total=sum(sent.values()))
    return out


def run(configs, size, nprocs, threads):
    from .launch import run_parallel

    rows = []
    for cfg in configs:
        for p in nprocs:
            res = run_parallel(
                _worker, p, args=(cfg, size, p > 1), threads=max(1, threads // p), timeout_s=3600
            )
            rows.append(dict(config=cfg, size=size, nproc=p, sharded=p > 1, ranks=res))
            print(_line(rows[-1]), flush=True)
    return rows


def _line(row):
    r = row['ranks']
    b = max(x['backbone']['peak_increase_mb'] for x in r) / 1024
    f = max(x['predict']['peak_increase_mb'] for x in r) / 1024
    tb = max(x['backbone']['time_s'] for x in r)
    tf = max(x['predict']['time_s'] for x in r)
    sent = sum(x.get('bytes_sent', {}).get('total', 0) for x in r) / MB
    return (
        f'{row["config"]} {row["size"]} px P={row["nproc"]}: backbone +{b:.2f} GB/rank '
        f'{tb:.1f} s | predict +{f:.2f} GB/rank {tf:.1f} s | sent {sent:.0f} MB (all ranks)'
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('configs', nargs='+')
    parser.add_argument('--size', type=int, default=2048)
    parser.add_argument('--nprocs', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--json')
    args = parser.parse_args(argv)
    rows = run(args.configs, args.size, args.nprocs, args.threads)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == '__main__':
    sys.exit(main())
