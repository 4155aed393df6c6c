"""Benchmark global softmax attention vs circulant and core attention.

Peak memory: CPU: every (method, map size, forward / forward+backward) runs
one pass in a fresh subprocess (peak RSS above the RSS after setup, read
with mmcirc.utils.memory); CUDA: in the timing
process, torch.cuda.max_memory_allocated of one pass above the allocation
before it (exact per method without a fresh process).

Time: one subprocess per (map size, mode) builds all methods, warms each up,
then times them round-robin (``--repeat`` rounds; slow ones are capped) and
reports the median per method, so that a changing machine load hits all
methods alike and the ratios between them stay meaningful.

Methods (C = 64 channels, batch 1, float32; ``--amp bf16``: under
torch.autocast with bfloat16, where circulant attention keeps its FFTs and
softmax in float32):
  sdpa         SDPASelfAttention (mmcirc.models.baselines): qkv Linear +
               torch SDPA (1 head of 64, PVT stage-1 style) + proj
  circ-circ    CirculantAttention, boundary='circular' (d = 1: 64 heads)
  circ-zero    CirculantAttention, boundary='zero'
  circ-linears the gate + qkv + proj Linears of CirculantAttention alone
  core-K       CoreAttentionWithBank (mmcirc.models.baselines): CoreAttention
               (1 head of 64) with C' = K active cores of a bank of 64

Usage:
  python tools/analysis/benchmark_attention.py [--sizes 32 64 128 256 512]
      [--repeat 5] [--device cpu|cuda] [--amp bf16] [--no-backward]
      [--out-dir work_dirs/benchmark_attention]

The acceptance targets (bottom of the table) are CPU targets; on CUDA the same
ratios are printed as information.
"""

import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time

from mmcirc.utils.cli import CLIError, main_guard
from mmcirc.utils.fileio import atomic_open

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DIM = 64
SDPA_HEADS = 1
CORE_HEADS = 1
CORE_COUNTS = (8, 16, 64)
METHODS = ('sdpa', 'circ-circ', 'circ-zero', 'circ-linears') + tuple(
    f'core-{k}' for k in CORE_COUNTS
)
SDPA_N2_CAP = 4 << 30  # skip SDPA once one fp32 N x N score map exceeds 4 GiB
MAX_SECONDS_PER_MEASUREMENT = 60.0


# ------------------------------------------------------------------ worker
def _build(method, size, device):
    import torch

    from mmcirc import ops
    from mmcirc.models.baselines import CoreAttentionWithBank, SDPASelfAttention

    n = size * size
    torch.manual_seed(0)
    x = torch.randn(1, n, DIM, device=device)

    if method == 'sdpa':
        model = SDPASelfAttention(DIM, SDPA_HEADS)
        run = model
    elif method.startswith('circ-') and method != 'circ-linears':
        model = ops.CirculantAttention(
            DIM, boundary='circular' if method == 'circ-circ' else 'zero'
        )

        def run(x):
            return model(x, (size, size))
    elif method == 'circ-linears':
        model = ops.CirculantAttention(DIM)

        def run(x):
            return model.proj(model.gate(x)), model.qkv(x)
    elif method.startswith('core-'):
        model = CoreAttentionWithBank(
            DIM, CORE_HEADS, int(method.split('-')[1]), bank_size=max(CORE_COUNTS)
        )
        run = model
    else:
        raise ValueError(f'method must be one of {METHODS}, got {method!r}')
    return model.to(device), run, x


def _step_fn(model, run, x, backward, device, amp=None):
    import contextlib

    import torch

    if backward:
        x.requires_grad_()
    else:
        model.eval()

    def autocast():
        if amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=getattr(torch, amp))

    def step():
        if backward:
            with autocast():
                out = run(x)
            out = out if isinstance(out, tuple) else (out,)
            sum(o.float().sum() for o in out).backward()
            model.zero_grad(set_to_none=True)
            x.grad = None
        else:
            with torch.no_grad(), autocast():
                out = run(x)
        if device.type == 'cuda':
            torch.cuda.synchronize()
        return out

    return step


def _cuda_peak_mb(step):
    """Peak CUDA memory of one pass above the allocation before it."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def memory_worker(spec):
    """Peak RSS of one pass of one method, in a fresh process (CPU; on CUDA
    the timing worker reads the allocator's peak per method)."""
    import torch

    if spec.get('threads'):
        torch.set_num_threads(spec['threads'])
    device = torch.device(spec['device'])
    step = _step_fn(
        *_build(spec['method'], spec['size'], device),
        spec['mode'] == 'fwd+bwd',
        device,
        spec.get('amp'),
    )
    import gc

    gc.collect()
    from mmcirc.utils.memory import peak_rss_bytes, reset_peak_rss, rss_bytes

    reset_peak_rss()  # the peak of what follows, above the RSS after setup
    base = rss_bytes()
    step()
    return {'peak_mb': max(peak_rss_bytes() - base, 0) / 2**20}


def timing_worker(spec):
    """Round-robin timing of several methods on one map size."""
    import torch

    if spec.get('threads'):
        torch.set_num_threads(spec['threads'])
    device = torch.device(spec['device'])
    steps, times, budget, extra = {}, {}, {}, {}
    for m in spec['methods']:
        steps[m] = _step_fn(
            *_build(m, spec['size'], device), spec['mode'] == 'fwd+bwd', device, spec.get('amp')
        )
        t0 = time.perf_counter()
        out = steps[m]()  # warm-up
        warm = time.perf_counter() - t0
        out = out if isinstance(out, tuple) else (out,)
        extra[m] = {'finite': all(bool(o.isfinite().all()) for o in out)}
        if device.type == 'cuda':  # allocator stats are per method already
            extra[m]['peak_mb'] = _cuda_peak_mb(steps[m])
        times[m] = []
        # slow methods get fewer rounds (at least 2)
        cap = spec.get('max_seconds', MAX_SECONDS_PER_MEASUREMENT)
        budget[m] = cap if warm * 2 < cap else 2 * warm
    for _ in range(spec['repeat']):
        for m, step in steps.items():
            if budget[m] <= 0 and len(times[m]) >= 2:
                continue
            t0 = time.perf_counter()
            step()
            times[m].append(time.perf_counter() - t0)
            budget[m] -= times[m][-1]
    return {
        m: dict(
            extra[m],
            time_ms=1e3 * statistics.median(t),
            min_ms=1e3 * min(t),
            runs=len(t),
            threads=torch.get_num_threads(),
        )
        for m, t in times.items()
    }


# ------------------------------------------------------------------ driver
def _device_name(device):
    import torch

    if device == 'cuda' and torch.cuda.is_available():
        return f'cuda ({torch.cuda.get_device_name()}, torch {torch.__version__})'
    return device


def _subprocess(kind, spec):
    proc = subprocess.run(
        [sys.executable, osp.abspath(__file__), '--worker', json.dumps(dict(spec, kind=kind))],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return {'error': tail[0] if tail else f'exit {proc.returncode}'}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(methods, size, mode, args):
    """{method: {'time_ms', 'min_ms', 'runs', 'peak_mb'}} for one size."""
    base = dict(
        size=size,
        mode=mode,
        device=args.device,
        threads=args.threads,
        amp=args.amp,
        max_seconds=args.max_seconds,
    )
    if args.device == 'cuda':  # the timing process reads the peak per method
        out = {m: {} for m in methods}
    else:
        out = {m: _subprocess('memory', dict(base, method=m)) for m in methods}
    timing = _subprocess('timing', dict(base, methods=list(methods), repeat=args.repeat))
    for m in methods:
        if 'error' in timing:
            out[m] = timing
        elif 'error' not in out[m]:
            out[m].update(timing[m])
    return out


def _fmt(r, key, fmt='{:.1f}'):
    if r is None:
        return '-'
    if 'skipped' in r:
        return r['skipped']
    if 'error' in r:
        return 'error'
    return fmt.format(r[key])


def _get(results, method, size, mode, key='time_ms'):
    r = results.get(f'{method}|{size}|{mode}')
    return None if r is None or key not in r else r[key]


def targets(results, device='cpu'):
    """The acceptance targets, as (description, value, verdict) rows (verdicts
    on CPU, where the targets are set; information on other devices)."""

    def ratio(m1, s1, m2, s2, mode='fwd', key='time_ms'):
        a = _get(results, m1, s1, mode, key)
        b = _get(results, m2, s2, mode, key)
        return None if a is None or b is None else a / b

    at_least = lambda x: lambda v: v >= x
    at_most = lambda x: lambda v: v <= x
    checks = [
        (
            '128^2 fwd time: SDPA / circulant (circular) >= 25',
            ratio('sdpa', 128, 'circ-circ', 128),
            at_least(25),
        ),
        ('128^2 fwd time: SDPA / circulant (zero)', ratio('sdpa', 128, 'circ-zero', 128), None),
        (
            '128^2 fwd time: circulant (circular) / its linears <= 3',
            ratio('circ-circ', 128, 'circ-linears', 128),
            at_most(3),
        ),
        (
            '128^2 fwd time: circulant (zero) / its linears',
            ratio('circ-zero', 128, 'circ-linears', 128),
            None,
        ),
        (
            "128^2 fwd time: SDPA / core (C'=64) >= 20",
            ratio('sdpa', 128, 'core-64', 128),
            at_least(20),
        ),
        (
            "256^2 fwd time: core C'=64 / C'=8 >= 3",
            ratio('core-64', 256, 'core-8', 256),
            at_least(3),
        ),
    ]
    for m in ('circ-circ', 'circ-zero', 'core-8', 'core-64'):
        for mode in ('fwd', 'fwd+bwd'):
            checks.append(
                (
                    f'{m} {mode}: peak memory 256^2 / 128^2 <= 4.5',
                    ratio(m, 256, m, 128, mode, 'peak_mb'),
                    at_most(4.5),
                )
            )
    rows = []
    for desc, value, ok in checks:
        if value is None:
            rows.append((desc, 'n/a', 'not measured'))
        else:
            verdict = 'info' if ok is None or device != 'cpu' else ('PASS' if ok(value) else 'FAIL')
            rows.append((desc, f'{value:.2f}', verdict))
    return rows


def markdown(results, args, modes):
    lines = [
        f'Device: {_device_name(args.device)}, C={DIM}, batch 1, '
        f'{"float32" if args.amp is None else args.amp + " autocast"}, '
        f'torch threads={args.threads}. SDPA: {SDPA_HEADS} head of '
        f'{DIM // SDPA_HEADS} (+ qkv/proj Linears); circulant: d=1 '
        f'(64 heads); core: {CORE_HEADS} head. Times in ms: median of '
        'round-robin runs; peak memory in MiB above the setup '
        + (
            'baseline (fresh process per entry).'
            if args.device == 'cpu'
            else 'allocation (CUDA allocator, per method).'
        ),
        '',
    ]
    head = ['method', 'map', 'N']
    for mode in modes:
        head += [f'{mode} ms', f'{mode} MiB']
    head.append('fwd speed-up vs SDPA')
    lines.append('| ' + ' | '.join(head) + ' |')
    lines.append('|' + '---|' * len(head))
    for size in args.sizes:
        for m in METHODS:
            row = [m, f'{size}x{size}', str(size * size)]
            for mode in modes:
                r = results.get(f'{m}|{size}|{mode}')
                row += [_fmt(r, 'time_ms'), _fmt(r, 'peak_mb')]
            s, t = _get(results, 'sdpa', size, 'fwd'), _get(results, m, size, 'fwd')
            row.append(f'{s / t:.1f}x' if s and t and m != 'sdpa' else '-')
            lines.append('| ' + ' | '.join(row) + ' |')
    lines += ['', '| target | value | result |', '|---|---|---|']
    lines += [f'| {d} | {v} | {ok} |' for d, v, ok in targets(results, args.device)]
    return '\n'.join(lines) + '\n'


def plot(results, args, modes, path):
    try:
        import matplotlib

        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib not installed: no PNG written')
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, m in enumerate(METHODS):  # one colour per method
        for mode, style in zip(modes, ('-o', '--x')):
            for ax, key in zip(axes, ('time_ms', 'peak_mb')):
                pts = [(s * s, _get(results, m, s, mode, key)) for s in args.sizes]
                pts = [(n, v) for n, v in pts if v]
                if pts:
                    ax.plot(*zip(*pts), style, color=f'C{i}', label=f'{m} {mode}')
    for ax, label in zip(axes, ('time [ms]', 'peak memory [MiB]')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('N = H*W tokens')
        ax.set_ylabel(label)
        ax.grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(
        f'Attention cost, C={DIM}, batch 1, {args.amp or "fp32"}, {_device_name(args.device)}'
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        '--sizes', type=int, nargs='+', default=[32, 64, 128, 256, 512], help='map sides H = W'
    )
    p.add_argument('--repeat', type=int, default=5, help='timed runs')
    p.add_argument('--device', default='cpu', help="'cpu' or 'cuda'")
    p.add_argument('--out-dir', default=osp.join(ROOT, 'work_dirs', 'benchmark_attention'))
    p.add_argument(
        '--max-seconds',
        type=float,
        default=MAX_SECONDS_PER_MEASUREMENT,
        help='timed seconds per method and size before its rounds stop (at least 2 runs)',
    )
    p.add_argument(
        '--amp',
        choices=['bf16', 'fp16'],
        default=None,
        help='run under torch.autocast with this dtype',
    )
    p.add_argument('--no-backward', action='store_true', help='forward only')
    p.add_argument(
        '--threads', type=int, default=None, help='torch threads of the workers (default: torch)'
    )
    p.add_argument(
        '--methods', nargs='+', default=list(METHODS), choices=METHODS, help='subset of methods'
    )
    p.add_argument('--worker', help=argparse.SUPPRESS)
    return p.parse_args(argv)


@main_guard
def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        fn = memory_worker if spec['kind'] == 'memory' else timing_worker
        print(json.dumps(fn(spec)))
        return
    import torch

    if args.device == 'cuda' and not torch.cuda.is_available():
        raise CLIError('--device cuda: CUDA is not available')
    args.threads = args.threads or torch.get_num_threads()
    args.amp = {'bf16': 'bfloat16', 'fp16': 'float16', None: None}[args.amp]
    modes = ['fwd'] if args.no_backward else ['fwd', 'fwd+bwd']
    os.makedirs(args.out_dir, exist_ok=True)
    results = {}
    for size in args.sizes:
        n = size * size
        for mode in modes:
            methods = list(args.methods)
            # CPU SDPA materialises the N x N scores; CUDA's kernels do not
            if 'sdpa' in methods and args.device == 'cpu' and n * n * 4 * SDPA_HEADS > SDPA_N2_CAP:
                methods.remove('sdpa')
                results[f'sdpa|{size}|{mode}'] = {'skipped': 'skipped (N^2 memory)'}
            for m, r in measure(methods, size, mode, args).items():
                results[f'{m}|{size}|{mode}'] = r
            for m in args.methods:
                r = results[f'{m}|{size}|{mode}']
                print(
                    f'{m:>13s} {size:4d}x{size:<4d} {mode:8s} '
                    + (
                        r.get('skipped')
                        or r.get('error')
                        or f'{r["time_ms"]:10.1f} ms {r["peak_mb"]:9.1f} MiB'
                        + ('' if r.get('finite', True) else '  NON-FINITE OUTPUT')
                    ),
                    flush=True,
                )
    table = markdown(results, args, modes)
    with atomic_open(osp.join(args.out_dir, 'results.json'), 'w') as f:
        json.dump(
            {
                'device': args.device,
                'dim': DIM,
                'threads': args.threads,
                'sizes': args.sizes,
                'results': results,
                'amp': args.amp,
                'device_name': _device_name(args.device),
                'targets': targets(results, args.device),
            },
            f,
            indent=1,
        )
    with atomic_open(osp.join(args.out_dir, 'table.md'), 'w') as f:
        f.write(table)
    plot(results, args, modes, osp.join(args.out_dir, 'benchmark.png'))
    print()
    print(table)


if __name__ == '__main__':
    main()
