"""Suite ``isotropic``: the released isotropic models against the plain-attention ViTs of
the same size, side by side in one run: CA-DeiT vs DeiT, VECA vs ViT (backbone forward).

Cases: the ``isotropic`` group of :mod:`mmcirc.benchmark.cases` (mmcirc's CADeiT /
VECAViT, timm's DeiT / ViT with ``dynamic_img_size``, random weights, no classifier);
each is compared with its plain-attention twin (``baseline``). Per size, all models are
measured together: on the CPU each one's peak memory in a fresh child (what the first
forward adds to the resident set), then one child times them round-robin (median of
``--repeat`` forwards after one warm-up, no grad; batch 1 and float32 unless ``--batch``
/ ``--precision``; a warm-up slower than ``--single-run-above`` seconds is the time, one
run, marked ``*``). FLOPs: multiply-adds of ``mmcirc.analysis.count_flops`` on the 1-
and 2-block models, extrapolated to the depth (exact for identical blocks;
``cases.count_macs``).

Writes ``DIR/results.json`` (merged with earlier runs of the same depth, threads, device,
precision and batch) and ``DIR/table.md``, atomically after every size.
"""

import argparse
import importlib.util
import os.path as osp
import sys
import time

from mmcirc.utils.cli import CLIError, main_guard, parse_hw

from ..cases import CASES, count_macs, group
from ..measurement import PRECISIONS
from ..report import ResultStore, environment, markdown_table, ratio
from ..tasks import measure

MODELS = group('isotropic')
DEFAULT_MODELS = ['ca_deit_s', 'deit_s', 'veca_b', 'vit_b']
DEFAULT_SIZES = ['224', '512', '1024', '2048']
PATCH = 16


def size_label(hw) -> str:
    return f'{hw[0]}x{hw[1]}'


def order(models):
    """Each circulant / core model right before its baseline (when both are asked for)."""
    out = []
    for name in models:
        base = CASES[name].baseline
        out += [n for n in (name, base) if n in models and n not in out]
    return out


def record(r) -> dict:
    """A result of :func:`mmcirc.benchmark.tasks.measure` in this table's layout."""
    if r['status'] != 'ok':
        return dict(error=f'{r["status"]} ({r.get("error", "")[:120]})', status=r['status'])
    out = {k: r[k] for k in ('threads', 'finite', 'time_ms', 'runs', 'times_ms', 'first_ms')}
    out.update(params_m=r['params'] / 1e6, peak_mb=r.get('peak_mb'), status='ok')
    out['peak_reset'] = r.get('peak_reset', True)
    if 'macs' in r:
        out['gmacs'] = r['macs'] / 1e9
    if 'flops_error' in r:
        out['gmacs_error'] = r['flops_error']
    return out


def flops(name, hw, depth=None) -> dict:
    try:
        return dict(gmacs=count_macs(name, hw, depth, extrapolate=True) / 1e9)
    except Exception as err:  # noqa: BLE001  (reported in the table, not fatal)
        return dict(gmacs_error=f'{type(err).__name__}: {str(err)[:200]}')


def table(results: dict) -> str:
    """Markdown table of every measurement; ratios against each model's baseline."""
    names, sizes = [], []
    for key in results:
        name, size = key.split('|')
        names += [name] if name not in names else []
        sizes += [size] if size not in sizes else []
    rows = []
    for size in sizes:
        for name in order(names):
            r = results.get(f'{name}|{size}')
            if r is None:
                continue
            label = CASES[name].label
            if 'error' in r:
                rows.append([size, label, '-', '-', r['error'], '-', '-', '-'])
                continue
            base = results.get(f'{CASES[name].baseline}|{size}', {})
            t = f'{r["time_ms"]:.1f}' + ('*' if r['runs'] == 1 else '') if 'time_ms' in r else '-'
            peak, bpeak = r.get('peak_mb'), base.get('peak_mb')
            rows.append(
                [
                    size,
                    label,
                    f'{r["params_m"]:.2f}' if 'params_m' in r else '-',
                    f'{r["gmacs"]:.2f}' if 'gmacs' in r else '-',
                    t,
                    f'{peak:.0f}' if peak is not None else '-',
                    ratio(base.get('time_ms'), r.get('time_ms'), suffix='x'),
                    ratio(peak, bpeak) if bpeak and bpeak > 0 and peak is not None else '-',
                ]
            )
    head = [
        'size',
        'model',
        'params (M)',
        'GMACs',
        'time (ms)',
        'peak mem (MiB)',
        'speed-up vs baseline',
        'memory vs baseline',
    ]
    return markdown_table(head, rows, 'llrrrrrr') + '\n'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        '--models', nargs='+', default=DEFAULT_MODELS, metavar='MODEL', help=f'from {MODELS}'
    )
    p.add_argument('--sizes', nargs='+', default=DEFAULT_SIZES, metavar='S|HxW')
    p.add_argument('--repeat', type=int, default=5, help='timed forwards after the warm-up')
    p.add_argument(
        '--single-run-above',
        type=float,
        default=20.0,
        help='seconds: a slower warm-up is the reported time (one run)',
    )
    p.add_argument(
        '--depth', type=int, default=None, help='keep the first DEPTH blocks (smoke tests)'
    )
    p.add_argument(
        '--threads', type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    p.add_argument('--no-flops', dest='flops', action='store_false', help='skip FLOP counting')
    p.add_argument(
        '--flops-only', action='store_true', help='count FLOPs only, add them to DIR/results.json'
    )
    p.add_argument('--timeout', type=float, default=3600.0, help='seconds per measurement')
    p.add_argument('--device', default='cpu', help='cpu or cuda')
    p.add_argument('--precision', default='fp32', choices=tuple(PRECISIONS), help='autocast dtype')
    p.add_argument('--batch', type=int, default=1, help='batch size')
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_isotropic'))
    p.add_argument('--fresh', action='store_true', help='ignore earlier results in out-dir')
    args = p.parse_args(argv)
    if args.flops_only and not args.flops:
        raise CLIError('--flops-only and --no-flops exclude each other')
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise CLIError(f'--models: unknown {unknown}; choose from {MODELS}')
    for opt in ('repeat', 'depth', 'threads', 'batch'):
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise CLIError(f'--{opt} must be a positive int, got {value}')
    for opt in ('single_run_above', 'timeout'):
        if getattr(args, opt) <= 0:
            raise CLIError(f'--{opt.replace("_", "-")} must be > 0, got {getattr(args, opt)}')
    args.sizes = [parse_hw(s, '--sizes', PATCH) for s in args.sizes]
    return args


@main_guard
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if any(CASES[m].flash for m in args.models) and importlib.util.find_spec('timm') is None:
        raise CLIError('the DeiT / ViT baselines need timm: pip install timm')
    command = 'python tools/analysis/benchmark_isotropic.py ' + ' '.join(argv)
    store = ResultStore(osp.join(args.out_dir, 'results.json'))
    settings = dict(
        depth=args.depth,
        threads=args.threads,
        device=args.device,
        precision=args.precision,
        batch=args.batch,
    )
    if args.flops_only:
        if not osp.isfile(store.path):
            raise CLIError(
                f'--flops-only: no {store.path} to add the counts to (run the timing first)'
            )
        store.load()
        store.extra['environment']['flops_command'] = command
    elif not args.fresh:
        store.load(settings=settings)
    env = store.extra.get('environment') if args.flops_only else environment(command, args.device)
    models = order(args.models)
    spec = dict(
        settings,
        repeat=args.repeat,
        single_run_above=args.single_run_above,
        flops='extrapolate' if args.flops else None,
    )
    for hw in args.sizes:
        t = time.perf_counter()
        if args.flops_only:
            res = {}
            for name in models:
                r = dict(store.results.get(f'{name}|{size_label(hw)}', {}))
                r.pop('gmacs_error', None)
                res[name] = dict(r, **flops(name, hw, args.depth))
        else:
            res = {
                n: record(r)
                for n, r in measure(models, dict(spec, hw=list(hw)), timeout=args.timeout).items()
            }
        for name, r in res.items():
            store.update({f'{name}|{size_label(hw)}': r})
            parts = (
                [
                    f'{r["time_ms"]:.1f} ms ({r["runs"]} run{"s" * (r["runs"] > 1)})',
                    f'{r["peak_mb"]:.0f} MiB',
                ]
                if 'time_ms' in r
                else []
            )
            parts += [f'{r["gmacs"]:.2f} GMACs'] if 'gmacs' in r else []
            parts += [f'FLOPs: {r["gmacs_error"]}'] if 'gmacs_error' in r else []
            parts += [] if r.get('finite', True) else ['NON-FINITE OUTPUT']
            msg = r.get('error') or ', '.join(parts)
            print(f'[{size_label(hw)}] {CASES[name].label}: {msg}', flush=True)
        print(f'[{size_label(hw)}] {time.perf_counter() - t:.0f} s', flush=True)
        text = table(store.results)
        store.save(environment=env)
        from mmcirc.utils.fileio import atomic_write

        atomic_write(osp.join(args.out_dir, 'table.md'), text)
    print('\n' + text + f'\nwritten: {osp.join(args.out_dir, "table.md")}, {store.path}')
    return store.results
