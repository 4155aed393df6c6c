"""Forward time and peak memory of mmcirc backbones against the mmdet / mmseg
baselines, side by side, over input sizes (batch 1, no grad, eval mode).

    python tools/analysis/benchmark_backbone.py [--models a b ...] [--sizes 224 512 ...]
        [--device cpu|cuda] [--threads N] [--timeout S] [--out-dir DIR]

Every (model, size) runs in a fresh subprocess (``--worker``), so peak memory is
that measurement's alone:

* time: median of several forwards after one warm-up; the number of timed runs
  shrinks with the warm-up time (``--budget`` seconds of timed runs, at most
  ``--repeats``, at least ``--min-repeats``); when the warm-up alone exceeds
  ``--single-run-above`` seconds, it is the reported time (one run).
* memory: CPU: peak RSS (``mmcirc.utils.memory.peak_rss_bytes``) minus the peak after building the
  model and its input, i.e. what the forward adds; CUDA: ``max_memory_allocated``
  minus the allocation before the forward.
* ``--timeout`` bounds each measurement (build + warm-up + runs); a model that
  times out or runs out of memory at one size is not tried at larger sizes.

Results: ``DIR/results_<device>.json`` (merged with earlier runs of other models /
sizes), ``DIR/time_<device>.png``, ``DIR/memory_<device>.png`` and a markdown table
with the ratios against each model's baseline. ``--flops`` adds the counted
FLOPs (multiply-adds, mmcirc.analysis) of each measurement.
"""

import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time

from mmcirc.utils.cli import main_guard
from mmcirc.utils.fileio import atomic_open

#: name -> (registry scope, backbone config, baseline name or None, label)
ZOO = {
    'pvt_s': (
        'mmdet',
        dict(type='PyramidVisionTransformer', num_layers=[3, 4, 6, 3]),
        None,
        'PVT-S (mmdet)',
    ),
    'circ_pvt_s': (
        'mmdet',
        dict(type='CAPVT', arch='small', stage_attentions='circulant'),
        'pvt_s',
        'all-circulant PVT-S',
    ),
    'core_pvt_s': (
        'mmdet',
        dict(type='CorePVT', arch='small', stage_attentions='core', num_cores=64),
        'pvt_s',
        "all-core PVT-S C'=64",
    ),
    'core_pvt_s_c8': (
        'mmdet',
        dict(type='CorePVT', arch='small', stage_attentions='core', num_cores=8),
        'pvt_s',
        "all-core PVT-S C'=8",
    ),
    'ca_pvt_s': ('mmdet', dict(type='CAPVT', arch='small'), 'pvt_s', 'CA-PVT-S (paper layout)'),
    'core_pvt_s_paper': (
        'mmdet',
        dict(type='CorePVT', arch='small', num_cores=64),
        'pvt_s',
        "Core-PVT-S (paper layout) C'=64",
    ),
    'swin_t': ('mmdet', dict(type='SwinTransformer'), None, 'Swin-T (mmdet)'),
    'swin_t_mmseg': ('mmseg', dict(type='SwinTransformer'), None, 'Swin-T (mmseg)'),
    'ca_swin_t': ('mmdet', dict(type='CASwin', arch='tiny'), 'swin_t', 'CA-Swin-T (paper layout)'),
    'core_swin_t': (
        'mmdet',
        dict(type='CoreSwin', arch='tiny', num_cores=64),
        'swin_t',
        "Core-Swin-T (paper layout) C'=64",
    ),
}
DEFAULT_MODELS = [
    'pvt_s',
    'circ_pvt_s',
    'core_pvt_s',
    'ca_pvt_s',
    'swin_t',
    'swin_t_mmseg',
    'ca_swin_t',
]
DEFAULT_SIZES = [224, 512, 1024, 1536, 2048]


def build_backbone(name, device='cpu', init=True):
    """Build a ZOO backbone (eval mode) on ``device``."""
    import importlib

    scope, cfg, _, _ = ZOO[name]
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    import mmcirc  # noqa: F401  (registers CAPVT & co. into mmdet/mmseg/mmpretrain)

    model = registry.build(dict(cfg, init_cfg=None))  # on CPU (mmdet calls .item())
    if init:
        from mmcirc.utils.quiet import quiet_logger

        with quiet_logger():  # init_weights logs every parameter at INFO
            model.init_weights()
    model = model.to(device)
    model.eval()  # (mmdet Swin's train() returns None)
    return model


def backbone_flops(name, size, model=None, device='cpu'):
    """Counted MACs of one forward at size x size (runs that forward once: the
    tracer executes the model; meta tensors fail on the patch-embedding convs)."""
    import torch

    from mmcirc.analysis import count_flops

    model = build_backbone(name, device, init=False) if model is None else model
    return count_flops(model, torch.randn(1, 3, size, size, device=device))


# ----------------------------------------------------------------------------- worker
def _rss_mb():
    """Peak RSS of this process so far, in MiB."""
    from mmcirc.utils.memory import peak_rss_bytes

    return peak_rss_bytes() / 2**20


def worker(args):
    """One measurement; prints ``RESULT {json}`` on its last line."""
    import gc

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    cuda = dev.type == 'cuda'
    t0 = time.perf_counter()
    model = build_backbone(args.model).to(dev)
    x = torch.randn(1, 3, args.size, args.size, device=dev)
    build_s = time.perf_counter() - t0
    gc.collect()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    with torch.no_grad():
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            base = _rss_mb()
        t = time.perf_counter()
        model(x)
        sync()
        warm = time.perf_counter() - t
        times = []
        if warm <= args.single_run_above:
            n = int(min(args.repeats, max(args.min_repeats, args.budget // max(warm, 1e-6))))
            for _ in range(n):
                t = time.perf_counter()
                model(x)
                sync()
                times.append(time.perf_counter() - t)
        if cuda:
            mem = (torch.cuda.max_memory_allocated() - base) / 2**20
        else:
            mem = _rss_mb() - base
    flops = None
    if args.flops:  # after the memory reading: tracing runs one more forward
        try:
            flops = backbone_flops(args.model, args.size, model, args.device)
        except Exception as e:  # noqa: BLE001
            flops = f'{type(e).__name__}: {e}'[:200]
    res = dict(
        model=args.model,
        size=args.size,
        device=args.device,
        threads=torch.get_num_threads(),
        time_s=statistics.median(times or [warm]),
        warmup_s=warm,
        runs=len(times) or 1,
        times_s=times or [warm],
        warmup_only=not times,
        mem_mb=mem,
        base_mb=base if not cuda else base / 2**20,
        build_s=build_s,
        status='ok',
    )
    if isinstance(flops, str):
        res['flops_error'] = flops
    elif flops is not None:
        res['flops'] = flops
    print('RESULT ' + json.dumps(res), flush=True)


def measure(model, size, args):
    """Run one measurement in a fresh subprocess; returns its result dict."""
    cmd = [
        sys.executable,
        osp.abspath(__file__),
        '--worker',
        '--model',
        model,
        '--size',
        str(size),
        '--device',
        args.device,
        '--repeats',
        str(args.repeats),
        '--min-repeats',
        str(args.min_repeats),
        '--budget',
        str(args.budget),
        '--single-run-above',
        str(args.single_run_above),
    ]
    if args.threads:
        cmd += ['--threads', str(args.threads)]
    if args.flops:
        cmd += ['--flops']
    load = os.getloadavg()[0]  # other jobs on the machine distort CPU timings
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(
            model=model,
            size=size,
            device=args.device,
            status='timeout',
            note=f'> {args.timeout:.0f} s',
        )
    wall = time.perf_counter() - t
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith('RESULT '):
            res = json.loads(line[len('RESULT ') :])
            res.update(wall_s=wall, load_before=load, load_after=os.getloadavg()[0])
            return res
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    oom = proc.returncode in (-9, 137) or any('out of memory' in s.lower() for s in tail)
    return dict(
        model=model,
        size=size,
        device=args.device,
        status='oom' if oom else 'error',
        note=f'rc={proc.returncode}: ' + ' | '.join(tail)[-300:],
    )


# ----------------------------------------------------------------------------- report
def table(results, models, sizes):
    """Markdown table: time, memory, FLOPs and ratios vs each model's baseline."""
    by = {(r['model'], r['size']): r for r in results}
    lines = [
        '| size | model | time (s) | peak mem (MB) | GMACs | speed-up vs baseline | '
        'mem / baseline | load |',
        '|---:|---|---:|---:|---:|---:|---:|---:|',
    ]
    for size in sizes:
        for m in models:
            r = by.get((m, size))
            if r is None:
                continue
            base = ZOO[m][2]
            b = by.get((base, size)) if base else None
            if r['status'] != 'ok':
                t, mem = r['status'], '-'
            else:
                t = f'{r["time_s"]:.3f}' + ('*' if r.get('warmup_only') else '')
                mem = f'{r["mem_mb"]:.0f}'
            fl = f'{r["flops"] / 1e9:.1f}' if r.get('flops') else '-'
            ok = r['status'] == 'ok' and b is not None and b['status'] == 'ok'
            speed = (
                f'{b["time_s"] / r["time_s"]:.2f}x'
                if ok
                else (f'> {b["note"]}' if b is not None and b['status'] == 'timeout' else '-')
            )
            memr = f'{r["mem_mb"] / b["mem_mb"]:.2f}' if ok and b['mem_mb'] > 0 else '-'
            load = f'{r["load_before"]:.1f}' if 'load_before' in r else '-'
            lines.append(
                f'| {size} | {ZOO[m][3]} | {t} | {mem} | {fl} | {speed} | {memr} | {load} |'
            )
    lines.append(
        '\n`*` one run (its warm-up), the measurement was too slow to repeat. '
        'load: 1-min load average before the measurement (CPU timings are only '
        'clean near 0 on an otherwise idle machine).'
    )
    return '\n'.join(lines)


def plot(results, models, out_dir, device):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    paths = []
    for key, ylabel, fname in (
        ('time_s', 'forward time (s)', 'time'),
        ('mem_mb', 'peak memory added by forward (MB)', 'memory'),
    ):
        fig, ax = plt.subplots(figsize=(7, 5))
        for m in models:
            pts = sorted(
                (r['size'], r[key])
                for r in results
                if r['model'] == m and r['status'] == 'ok' and r[key] > 0
            )
            if pts:
                style = '--' if ZOO[m][2] is None else '-'
                ax.plot(*zip(*pts), style, marker='o', label=ZOO[m][3])
        ax.set_xscale('log', base=2)
        ax.set_yscale('log')
        ax.set_xlabel('input size (px, square)')
        ax.set_ylabel(ylabel)
        ax.set_title(f'backbone forward, batch 1, {device}')
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=8)
        path = osp.join(out_dir, f'{fname}_{device}.png')
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--models',
        nargs='+',
        default=DEFAULT_MODELS,
        choices=sorted(ZOO),
        metavar='MODEL',
        help=f'from {sorted(ZOO)}',
    )
    parser.add_argument('--sizes', nargs='+', type=int, default=DEFAULT_SIZES)
    parser.add_argument('--device', default=None, help='cpu or cuda (default: cuda if present)')
    parser.add_argument('--threads', type=int, default=0, help='CPU threads (0: torch default)')
    parser.add_argument('--timeout', type=float, default=300.0, help='seconds per measurement')
    parser.add_argument('--repeats', type=int, default=10, help='most timed runs')
    parser.add_argument('--min-repeats', type=int, default=1, help='fewest timed runs')
    parser.add_argument('--budget', type=float, default=10.0, help='seconds of timed runs')
    parser.add_argument(
        '--single-run-above',
        type=float,
        default=30.0,
        help='warm-up seconds above which the warm-up is the measurement',
    )
    parser.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_backbone'))
    parser.add_argument(
        '--flops',
        action='store_true',
        help='also count FLOPs (one more forward per measurement, after '
        'the memory reading; counts within --timeout)',
    )
    parser.add_argument('--fresh', action='store_true', help='ignore earlier results in out-dir')
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--model', help=argparse.SUPPRESS)
    parser.add_argument('--size', type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    if args.device is None:
        import torch

        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.worker:
        return worker(args)
    os.makedirs(args.out_dir, exist_ok=True)
    json_path = osp.join(args.out_dir, f'results_{args.device}.json')
    old = []
    if osp.isfile(json_path) and not args.fresh:
        with open(json_path) as f:
            old = json.load(f).get('results', [])
    results = [
        r
        for r in old
        if (r['model'], r['size']) not in {(m, s) for m in args.models for s in args.sizes}
    ]
    sizes = sorted(args.sizes)
    for size in sizes:  # size-major: the models of one size run side by side
        for m in args.models:
            if any(
                r['model'] == m and r['size'] < size and r['status'] in ('timeout', 'oom')
                for r in results
            ):
                results.append(
                    dict(
                        model=m,
                        size=size,
                        device=args.device,
                        status='skipped',
                        note='smaller size did not finish',
                    )
                )
                continue
            r = measure(m, size, args)
            results.append(r)
            msg = (
                f'{r["time_s"]:.3f} s ({r["runs"]} runs), {r["mem_mb"]:.0f} MB'
                if r['status'] == 'ok'
                else f'{r["status"]} {r.get("note", "")}'
            )
            print(f'[{size}] {m}: {msg}', flush=True)
            with atomic_open(json_path, 'w') as f:
                json.dump(dict(device=args.device, results=results), f, indent=1)
    all_models = [m for m in ZOO if any(r['model'] == m for r in results)]
    all_sizes = sorted({r['size'] for r in results})
    md = table(results, all_models, all_sizes)
    print('\n' + md)
    with atomic_open(osp.join(args.out_dir, f'table_{args.device}.md'), 'w') as f:
        f.write(md + '\n')
    for p in plot(results, all_models, args.out_dir, args.device):
        print('wrote', p)
    print('wrote', json_path)


if __name__ == '__main__':
    main()
