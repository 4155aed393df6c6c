"""Suite ``gpu``: CA-DeiT-T against DeiT-T on the GPU: eager vs ``torch.compile``, bf16
and fp32, batch 1 and 32, 224-4096 px, in one run with a time budget.

Models: the ``isotropic`` cases (mmcirc's CADeiT / VECAViT against timm's DeiT / ViT,
random weights, backbone forward). The baselines' SDPA is pinned to the flash kernel
under bf16 / fp16 on CUDA (fp32: what SDPA picks); the circulant FFTs stay in fp32.
``compile``: ``torch.compile(model, mode=--compile-mode)`` (default ``reduce-overhead``:
CUDA graphs), one static graph per size; the first call's time (compile) is reported.
Each cell group (batch, precision, size, mode) times its models round-robin: median of
``--repeat`` calls after three warm-ups, synchronised; memory: peak allocated over one
more call (CUDA). Order: batch 1 before 32, bf16 before fp32, sizes ascending, so that
``--budget-s`` cuts the least important cells (listed as skipped).

Needs torch and timm only (run from a copy with ``PYTHONPATH=.``). Writes
``results_<device>.json`` and ``table_<device>.md`` in ``--out-dir`` after every group.
"""

import argparse
import importlib.util
import os.path as osp
import time

from mmcirc.utils.cli import CLIError, main_guard

from ..cases import CASES, group
from ..measurement import COMPILE_MODES, PeakMeter, finite, make_step, round_robin
from ..report import ResultStore, device_name, markdown_table, speedup

PRECISIONS = ('bf16', 'fp32', 'fp16')
MODELS = tuple(group('isotropic'))
PATCH = 16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default=None, help='cuda or cpu (default: cuda if present)')
    p.add_argument('--models', nargs='+', default=['deit_t', 'ca_deit_t'], choices=MODELS)
    p.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024, 1536, 2048, 3072, 4096])
    p.add_argument('--batches', nargs='+', type=int, default=[1, 32])
    p.add_argument('--precisions', nargs='+', default=['bf16', 'fp32'], choices=PRECISIONS)
    p.add_argument('--modes', nargs='+', default=['eager', 'compile'], choices=['eager', 'compile'])
    p.add_argument('--compile-mode', default='reduce-overhead', choices=COMPILE_MODES)
    p.add_argument(
        '--compile-backend',
        default='inductor',
        help="torch.compile backend ('eager'/'aot_eager' only trace)",
    )
    p.add_argument(
        '--compile-max-size', type=int, default=2048, help='compile only up to this size'
    )
    p.add_argument('--repeat', type=int, default=10, help='timed calls per cell')
    p.add_argument(
        '--depth', type=int, default=12, help='keep the first DEPTH blocks (12: the real models)'
    )
    p.add_argument(
        '--budget-s',
        type=float,
        default=480.0,
        help='stop starting new cells after this many seconds',
    )
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_gpu'))
    args = p.parse_args(argv)
    for name in ('repeat', 'budget_s', 'compile_max_size', 'depth'):
        if getattr(args, name) <= 0:
            raise CLIError(f'--{name.replace("_", "-")} must be > 0, got {getattr(args, name)}')
    if any(b < 1 for b in args.batches):
        raise CLIError(f'--batches must be positive ints, got {args.batches}')
    if any(s < PATCH or s % PATCH for s in args.sizes):
        raise CLIError(f'--sizes must be multiples of the patch size {PATCH}, got {args.sizes}')
    return args


def key(name, size, batch, precision, mode):
    return f'{name}|{size}|{batch}|{precision}|{mode}'


def groups(args):
    """(size, batch, precision, mode) in measuring order."""
    for batch in args.batches:
        for precision in args.precisions:
            for size in args.sizes:
                for mode in args.modes:
                    if mode != 'compile' or size <= args.compile_max_size:
                        yield size, batch, precision, mode


def run_group(models, size, batch, precision, mode, args):
    """{name: cell} of one group, its models timed round-robin."""
    import torch

    compile = None
    if mode == 'compile':
        torch._dynamo.reset()
        compile = dict(backend=args.compile_backend)
        if args.compile_backend == 'inductor':
            compile['mode'] = args.compile_mode
    steps, cells = {}, {}
    for name in args.models:
        model, call = models[name]
        x = CASES[name].make_input(size, batch, args.device)
        steps[name] = make_step(
            model,
            call,
            x,
            device=args.device,
            precision=precision,
            compile=compile,
            flash=CASES[name].flash,
        )
        cells[name] = dict(params=sum(p.numel() for p in model.parameters()))
    on_first = lambda n, out: cells[n].update(finite=finite(out))  # noqa: E731
    try:
        timed = round_robin(
            steps, repeat=args.repeat, warmup=3, on_first=on_first, record_errors=True
        )
        for name, r in timed.items():
            if r.get('status', 'ok') != 'ok':
                cells[name] = dict(error=r['error'])
                continue
            cells[name].update(time_ms=r['time_ms'], first_call_s=r['first_ms'] / 1e3)
            if args.device == 'cuda':
                with PeakMeter('cuda') as meter:
                    steps[name]()
                cells[name]['peak_mb'] = meter.peak_mb
    except Exception as err:  # noqa: BLE001  (a failed group is a result, not the end)
        from mmcirc.utils.memory import is_out_of_memory

        text = (
            'out of memory' if is_out_of_memory(err) else f'{type(err).__name__}: {str(err)[:200]}'
        )
        cells = {name: dict(error=text) for name in args.models}
    del steps
    if args.device == 'cuda':
        torch.cuda.empty_cache()
    return cells


def table(results, args, dev_name):
    compiled = f', mode={args.compile_mode!r}). ' if args.compile_backend == 'inductor' else '). '
    lines = [
        f'Device: {dev_name}. Forward, no grad, median of {args.repeat} calls. '
        f'compile: torch.compile(backend={args.compile_backend!r}'
        + compiled
        + f'{args.depth} blocks. bf16 / fp16: autocast (the baselines on the flash SDPA '
        'kernel; circulant FFTs in fp32). Speed-up: the time of the plain-attention twin '
        '(DeiT for CA-DeiT, ViT for VECA; same width, batch, precision and mode) over the '
        "model's.",
        '',
    ]
    rows = []
    for batch in args.batches:
        for precision in args.precisions:
            for size in args.sizes:
                for name in args.models:
                    e = results.get(key(name, size, batch, precision, 'eager'), {})
                    c = results.get(key(name, size, batch, precision, 'compile'), {})
                    if not e and not c:
                        continue
                    base = CASES[name].baseline
                    speed = [
                        speedup(
                            results.get(key(base, size, batch, precision, mode)) if base else None,
                            r,
                        )
                        for mode, r in (('eager', e), ('compile', c))
                    ]
                    cell = lambda r: (
                        r.get('error') or (f'{r["time_ms"]:.2f}' if 'time_ms' in r else '-')
                    )  # noqa: E731
                    peak = e.get('peak_mb', c.get('peak_mb'))
                    rows.append(
                        [
                            batch,
                            precision,
                            size,
                            CASES[name].label,
                            cell(e),
                            cell(c),
                            f'{c["first_call_s"]:.1f}' if 'time_ms' in c else '-',
                            '-' if peak is None else f'{peak:.0f}',
                            *speed,
                        ]
                    )
    head = [
        'batch',
        'precision',
        'size',
        'model',
        'eager (ms)',
        'compiled (ms)',
        'compile (s)',
        'peak MiB',
        'speed-up eager',
        'speed-up compiled',
    ]
    return '\n'.join(lines) + markdown_table(head, rows, 'rlrlrrrrrr') + '\n'


@main_guard
def main(argv=None):
    args = parse_args(argv)
    import torch

    if importlib.util.find_spec('timm') is None:
        raise CLIError('benchmark_gpu.py needs timm (the DeiT / ViT baselines): pip install timm')
    args.device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if args.device not in ('cuda', 'cpu'):
        raise CLIError(f'--device must be cuda or cpu, got {args.device!r}')
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise CLIError('--device cuda: CUDA is not available')
    torch._dynamo.config.automatic_dynamic_shapes = False  # one static graph per size
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    dev_name = device_name(args.device, torch.get_num_threads())
    depth = args.depth if args.depth < 12 else None  # None: all 12 blocks
    models = {}
    for name in args.models:
        torch.manual_seed(0)
        model, call = CASES[name].builder((224, 224), depth)
        models[name] = (model.to(args.device), call)
    store = ResultStore(osp.join(args.out_dir, f'results_{args.device}.json'))
    skipped, start = [], time.perf_counter()
    for size, batch, precision, mode in groups(args):
        keys = [key(n, size, batch, precision, mode) for n in args.models]
        if time.perf_counter() - start > args.budget_s:
            skipped += keys
            continue
        cells = run_group(models, size, batch, precision, mode, args)
        for name, r in cells.items():
            store.update({key(name, size, batch, precision, mode): r})
            msg = r.get('error') or (
                f'{r["time_ms"]:.2f} ms (first call {r["first_call_s"]:.1f} s'
                + (f', {r["peak_mb"]:.0f} MiB' if 'peak_mb' in r else '')
                + ')'
                + ('' if r['finite'] else ', NON-FINITE OUTPUT')
            )
            print(f'[{batch} x {size}, {precision}, {mode}] {CASES[name].label}: {msg}', flush=True)
        store.save(device=dev_name, args=vars(args), skipped=skipped)
    text = table(store.results, args, dev_name)
    if skipped:
        text += f'\nSkipped (time budget {args.budget_s:g} s): {", ".join(skipped)}\n'
    store.save(device=dev_name, args=vars(args), skipped=skipped)
    from mmcirc.utils.fileio import atomic_write

    atomic_write(osp.join(args.out_dir, f'table_{args.device}.md'), text)
    print('\n' + text)
    return store.results
