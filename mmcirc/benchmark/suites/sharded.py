"""Suite ``sharded``: per-rank memory and time of sharded whole-image inference
(:mod:`mmcirc.distributed.segmentor`) against one process, side by side in one run; with
``--train``, of one training step instead.

For each config and P: P local gloo ranks (``run_parallel``; P = 1 is the unsharded
segmentor in one child process), random weights (seed 0, rank 0's on every rank),
scikit-image's astronaut bicubic-resized to S x S (:func:`astronaut`). Each rank measures
with the harness's :class:`~mmcirc.benchmark.measurement.PeakMeter` (peak RSS above the
rank's RSS just before, the high-water mark reset first) and the wall time: the backbone
alone (preprocessed band in, its bands of the stage maps out) and the whole prediction
(image on rank 0 -> labels on rank 0), plus the bytes each rank hands to
torch.distributed during the prediction (:func:`mmcirc.distributed.comm.count_bytes`).
``--threads``: torch threads of the single process; each of P ranks gets
``max(1, threads // P)``.

``--train``: one SGD step of the segmentor in train mode on a batch of that image with
random labels (seed 0): mmengine's ``train_step`` in one process (P = 1), the
:class:`~mmcirc.distributed.segmentor.train.SpatialParallel` wrapper's on P ranks (the
check before the first step outside the measurement); each rank's peak RSS increase and
wall time of the step (forward, backward, gradient sum, update). With ``shard_sizes``
(the values of S), each P whose ranks S divides is also run as a data x space mesh of
P / S data groups of S spatial ranks, each group one image: the time per image (the
step's over the P / S images) and the memory per rank of D x S against 1 x P
(``DIR/table_mesh.md``).

Writes ``DIR/results.json`` (merged across runs of the same settings) and
``DIR/table.md`` (ratios against P = 1 of the same config and size) after every P.
"""

import os.path as osp
import time

from mmcirc.utils.fileio import atomic_write

from ..grid import at_least
from ..measurement import PeakMeter
from ..report import ResultStore, environment, markdown_table, ratio

MB = 1024**2
SHARED = dict(out_dir=None, threads=2)


def add_arguments(p):
    p.add_argument('configs', nargs='+', help='mmseg configs of shardable segmentors')
    p.add_argument('--size', type=int, default=2048, help='image side S (S x S)')
    p.add_argument('--nprocs', nargs='+', type=int, default=[1, 2], help='values of P')
    p.add_argument('--train', action='store_true', help='one training step, not inference')
    p.add_argument('--shard-sizes', nargs='+', type=int, default=[],
                   help='with --train: also each P as P / S data groups of S ranks')  # fmt: skip


def check(args):
    at_least(args, ['size'], 32)
    at_least(args, ['nprocs', 'threads', 'shard_sizes'])
    for cfg in args.configs:
        if not osp.isfile(cfg):
            raise ValueError(f'config file not found: {cfg}')


def astronaut(size):
    """scikit-image's astronaut, BGR uint8, bicubic-resized to ``size`` x ``size`` (mmcv):
    the input of every run."""
    import mmcv
    import numpy as np
    import skimage.data

    bgr = np.ascontiguousarray(skimage.data.astronaut()[..., ::-1])
    return mmcv.imresize(bgr, (size, size), interpolation='bicubic')


def _measure(fn):
    """``fn()`` under the peak meter: (its output, {time_s, peak_increase_mb})."""
    with PeakMeter('cpu') as meter:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
    return out, dict(time_s=round(dt, 3), peak_increase_mb=round(meter.peak_mb, 1))


def _setup(cfg, size):
    """A rank's ``(rank, segmentor of random weights (seed 0), image)``."""
    from mmcirc.apis.builder import build_model
    from mmcirc.apis.highres import load_highres_config
    from mmcirc.distributed.comm import group_rank_size

    return group_rank_size()[0], build_model(load_highres_config(cfg), seed=0), astronaut(size)


def _worker(cfg, size, sharded):
    import torch
    import torch.distributed as dist

    from mmcirc.apis import highres as hr
    from mmcirc.distributed.comm import count_bytes
    from mmcirc.distributed.segmentor.infer import sync_weights
    from mmcirc.distributed.segmentor.model import predict_sharded, scatter_image, shard_model

    rank, model, img = _setup(cfg, size)
    out = dict(rank=rank)
    with torch.no_grad():
        if not sharded:
            x = model.data_preprocessor(hr.make_data(img), False)['inputs']
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
        x = s.preprocess(band[None], img.shape[0])
        dist.barrier()
        feats, out['backbone'] = _measure(lambda: s.backbone_feat(x))
        del feats, x, band
        dist.barrier()
        with count_bytes() as sent:
            _, out['predict'] = _measure(lambda: predict_sharded(s, img, img.shape[:2]))
        out['bytes_sent'] = dict(sent, total=sum(sent.values()))
    return out


def _train_worker(cfg, size, sharded, shard_size=None):
    import torch
    import torch.distributed as dist
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import OptimWrapper
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    from mmcirc.distributed.segmentor.infer import sync_weights
    from mmcirc.distributed.segmentor.train import SpatialParallel

    rank, model, img = _setup(cfg, size)
    model = revert_sync_batchnorm(model).train()
    g = torch.Generator().manual_seed(0)
    sample = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size)))
    k = int(model.decode_head.out_channels)
    sample.gt_sem_seg = PixelData(data=torch.randint(0, k, (1, size, size), generator=g))
    data = dict(inputs=[torch.from_numpy(img.transpose(2, 0, 1)).contiguous()],
                data_samples=[sample])  # fmt: skip
    step = model.train_step
    if sharded:
        sync_weights(model)
        wrapped = SpatialParallel(model, shard_size=shard_size)  # one image per data group
        step = wrapped.train_step
        dist.barrier()
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=1e-3))
    torch.manual_seed(0)
    log, out = _measure(lambda: step(data, optim))
    return dict(rank=rank, train_step=out, loss=float(log['loss']))


def _top(ranks, part, key='peak_increase_mb'):
    """The largest rank's figure: ``key`` of ``part`` (peak MB in GB; seconds)."""
    top = max(x[part][key] for x in ranks)
    return top / 1024 if key == 'peak_increase_mb' else top


def mesh_table(results):
    """The training steps of every P run as several meshes (D x S, D = P / S images a
    step): the slowest rank's step time over D, the largest rank's peak RSS increase."""
    rows = []
    runs = [r for r in results.values() if r.get('train') and r['nproc'] > 1]
    same = lambda r: (r['config'], r['size'], r['nproc'])  # noqa: E731
    for row in sorted(runs, key=lambda r: (*same(r), -_shard(r))):
        if sum(same(r) == same(row) for r in runs) < 2:
            continue
        s, p, step = _shard(row), row['nproc'], _top(row['ranks'], 'train_step', 'time_s')
        rows.append([osp.basename(row['config']), f'{row["size"]}x{row["size"]}', p,
                     f'{p // s} x {s}', f'{_top(row["ranks"], "train_step"):.2f}', f'{step:.1f}',
                     f'{step * s / p:.1f}'])  # fmt: skip
    head = ['config', 'size', 'W', 'mesh (data x space)', 'train step per rank (GB)',
            'step time (s)', 'time per image (s)']  # fmt: skip
    return markdown_table(head, rows, 'llrrrrr') + '\n'


def _shard(row):
    return row.get('shard_size') or row['nproc']


def summary(row):
    """The figures of one (config, size, P) record: the largest rank's."""
    r = row['ranks']
    return dict(
        backbone_gb=_top(r, 'backbone'), predict_gb=_top(r, 'predict'),
        backbone_s=_top(r, 'backbone', 'time_s'), predict_s=_top(r, 'predict', 'time_s'),
        sent_mb=sum(x.get('bytes_sent', {}).get('total', 0) for x in r) / MB,
    )  # fmt: skip


def train_table(results):
    rows = []
    for key, row in sorted(results.items()):
        if not row.get('train') or _shard(row) != row['nproc']:  # meshes: mesh_table
            continue
        gb = _top(row['ranks'], 'train_step')
        one = results.get(f'{row["config"]}@{row["size"]}@1@train')
        rows.append([osp.basename(row['config']), f'{row["size"]}x{row["size"]}', row['nproc'],
                     f'{gb:.2f}', ratio(gb, _top(one['ranks'], 'train_step') if one else None),
                     f'{_top(row["ranks"], "train_step", "time_s"):.1f}',
                     f'{row["ranks"][0]["loss"]:.6f}'])  # fmt: skip
    head = ['config', 'size', 'P', 'train step per rank (GB)', 'ratio to P = 1',
            'step time (s)', 'loss']  # fmt: skip
    return markdown_table(head, rows, 'llrrrrr') + '\n'


def table(results):
    rows = []
    for key, row in sorted(results.items()):
        if row.get('train'):
            continue
        s = summary(row)
        one = results.get(f'{row["config"]}@{row["size"]}@1')
        base = summary(one) if one else {}
        rows.append([osp.basename(row['config']), f'{row["size"]}x{row["size"]}', row['nproc'],
                     f'{s["backbone_gb"]:.2f}', ratio(s['backbone_gb'], base.get('backbone_gb')),
                     f'{s["predict_gb"]:.2f}', ratio(s['predict_gb'], base.get('predict_gb')),
                     f'{s["backbone_s"]:.1f}', f'{s["predict_s"]:.1f}',
                     f'{s["sent_mb"]:.0f}'])  # fmt: skip
    head = ['config', 'size', 'P', 'backbone per rank (GB)', 'ratio to P = 1',
            'predict per rank (GB)', 'ratio', 'backbone time (s)', 'predict time (s)',
            'sent per image (MB)']  # fmt: skip
    return markdown_table(head, rows, 'llrrrrrrrr') + '\n'


def _sizes(p, shard_sizes):
    """The shard sizes to run P ranks as: P itself (one spatial group), then each of
    ``shard_sizes`` below P that divides it."""
    return [p] + [s for s in shard_sizes if s < p and p % s == 0]


def run(args):
    """Every config at every P (with ``--train --shard-sizes``, every mesh of P:
    :func:`_sizes`); the results and the tables written after each (``args``: the flags,
    checked by :func:`check`)."""
    from mmcirc.distributed.launch import run_parallel

    store = ResultStore(osp.join(args.out_dir, 'results.json')).load(dict(threads=args.threads))
    train, meshes = args.train, args.shard_sizes if args.train else ()
    for cfg in args.configs:
        for p, s in [(p, s) for p in args.nprocs for s in _sizes(p, meshes)]:
            ranks = run_parallel(
                _train_worker if train else _worker,
                p,
                args=(cfg, args.size, p > 1) + ((s,) if train else ()),
                # training ranks run backward: not forked from a process that may have
                # started autograd's worker threads (see run_parallel)
                start_method='forkserver' if train else 'fork',
                threads=max(1, args.threads // p),
                timeout_s=3600,
            )
            row = dict(config=cfg, size=args.size, nproc=p, sharded=p > 1, ranks=ranks)
            key = f'{cfg}@{args.size}@{p}'
            if train:
                row.update(train=True, shard_size=s)
                key += '@train' + ('' if s == p else f'@S{s}')  # 1 x P: the key before meshes
            store.update({key: row})
            store.save(environment=environment(threads=args.threads))
            if train:
                step = _top(ranks, 'train_step', 'time_s')
                print(f'{cfg} {args.size} px P={p} ({p // s} x {s}): train step '
                      f'+{_top(ranks, "train_step"):.2f} GB/rank, {step:.1f} s, '
                      f'{step * s / p:.1f} s per image', flush=True)  # fmt: skip
                tables = {'table_train.md': train_table, 'table_mesh.md': mesh_table}
            else:
                m = summary(row)
                print(f'{cfg} {args.size} px P={p}: backbone +{m["backbone_gb"]:.2f} GB/rank '
                      f'{m["backbone_s"]:.1f} s | predict +{m["predict_gb"]:.2f} GB/rank '
                      f'{m["predict_s"]:.1f} s | sent {m["sent_mb"]:.0f} MB (all ranks)',
                      flush=True)  # fmt: skip
                tables = {'table.md': table}
            for name, render in tables.items():
                atomic_write(osp.join(args.out_dir, name), render(store.results))
    return store.results
