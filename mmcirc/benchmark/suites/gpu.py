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

import os.path as osp
import time

from ..cases import CASES, group
from ..measurement import PeakMeter, finite, make_step, round_robin
from ..report import ResultStore, device_name, markdown_table, speedup

PRECISIONS = ('bf16', 'fp32', 'fp16')
MODELS = tuple(group('isotropic'))
PATCH = 16


def key(name, size, batch, precision, mode):
    return f'{name}|{size}|{batch}|{precision}|{mode}'


def groups(options):
    """(size, batch, precision, mode) in measuring order."""
    for batch in options.batches:
        for precision in options.precisions:
            for size in options.sizes:
                for mode in options.modes:
                    if mode != 'compile' or size <= options.compile_max_size:
                        yield size, batch, precision, mode


def run_group(models, size, batch, precision, mode, options):
    """{name: cell} of one group, its models timed round-robin."""
    import torch

    compile = None
    if mode == 'compile':
        torch._dynamo.reset()
        compile = dict(backend=options.compile_backend)
        if options.compile_backend == 'inductor':
            compile['mode'] = options.compile_mode
    steps, cells = {}, {}
    for name in options.models:
        model, call = models[name]
        x = CASES[name].make_input(size, batch, options.device)
        steps[name] = make_step(
            model,
            call,
            x,
            device=options.device,
            precision=precision,
            compile=compile,
            flash=CASES[name].flash,
        )
        cells[name] = dict(params=sum(p.numel() for p in model.parameters()))
    on_first = lambda n, out: cells[n].update(finite=finite(out))  # noqa: E731
    try:
        timed = round_robin(
            steps, repeat=options.repeat, warmup=3, on_first=on_first, record_errors=True
        )
        for name, r in timed.items():
            if r.get('status', 'ok') != 'ok':
                cells[name] = dict(error=r['error'])
                continue
            cells[name].update(time_ms=r['time_ms'], first_call_s=r['first_ms'] / 1e3)
            if options.device == 'cuda':
                with PeakMeter('cuda') as meter:
                    steps[name]()
                cells[name]['peak_mb'] = meter.peak_mb
    except Exception as err:  # noqa: BLE001  (a failed group is a result, not the end)
        from mmcirc.utils.memory import is_out_of_memory

        text = (
            'out of memory' if is_out_of_memory(err) else f'{type(err).__name__}: {str(err)[:200]}'
        )
        cells = {name: dict(error=text) for name in options.models}
    del steps
    if options.device == 'cuda':
        torch.cuda.empty_cache()
    return cells


def table(results, options, dev_name):
    compiled = (
        f', mode={options.compile_mode!r}). ' if options.compile_backend == 'inductor' else '). '
    )
    lines = [
        f'Device: {dev_name}. Forward, no grad, median of {options.repeat} calls. '
        f'compile: torch.compile(backend={options.compile_backend!r}'
        + compiled
        + f'{options.depth} blocks. bf16 / fp16: autocast (the baselines on the flash SDPA '
        'kernel; circulant FFTs in fp32). Speed-up: the time of the plain-attention twin '
        '(DeiT for CA-DeiT, ViT for VECA; same width, batch, precision and mode) over the '
        "model's.",
        '',
    ]
    rows = []
    for batch in options.batches:
        for precision in options.precisions:
            for size in options.sizes:
                for name in options.models:
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


def run(options):
    """Every cell group in order until the time budget; write the results and the table
    after each.

    ``options``: the suite's settings as attributes, those of its command's flags
    (``python -m mmcirc.benchmark gpu``, which checks them).
    """
    import torch

    torch._dynamo.config.automatic_dynamic_shapes = False  # one static graph per size
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    dev_name = device_name(options.device, torch.get_num_threads())
    depth = options.depth if options.depth < 12 else None  # None: all 12 blocks
    models = {}
    for name in options.models:
        torch.manual_seed(0)
        model, call = CASES[name].builder((224, 224), depth)
        models[name] = (model.to(options.device), call)
    store = ResultStore(osp.join(options.out_dir, f'results_{options.device}.json'))
    skipped, start = [], time.perf_counter()
    for size, batch, precision, mode in groups(options):
        keys = [key(n, size, batch, precision, mode) for n in options.models]
        if time.perf_counter() - start > options.budget_s:
            skipped += keys
            continue
        cells = run_group(models, size, batch, precision, mode, options)
        for name, r in cells.items():
            store.update({key(name, size, batch, precision, mode): r})
            msg = r.get('error') or (
                f'{r["time_ms"]:.2f} ms (first call {r["first_call_s"]:.1f} s'
                + (f', {r["peak_mb"]:.0f} MiB' if 'peak_mb' in r else '')
                + ')'
                + ('' if r['finite'] else ', NON-FINITE OUTPUT')
            )
            print(f'[{batch} x {size}, {precision}, {mode}] {CASES[name].label}: {msg}', flush=True)
        store.save(device=dev_name, args=vars(options), skipped=skipped)
    text = table(store.results, options, dev_name)
    if skipped:
        text += f'\nSkipped (time budget {options.budget_s:g} s): {", ".join(skipped)}\n'
    store.save(device=dev_name, args=vars(options), skipped=skipped)
    from mmcirc.utils.fileio import atomic_write

    atomic_write(osp.join(options.out_dir, f'table_{options.device}.md'), text)
    print('\n' + text)
    return store.results
