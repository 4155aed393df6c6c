"""Suite ``attention``: one attention layer (global softmax SDPA, circulant, core) on
square maps, time and peak memory against N = H*W, with the CPU acceptance targets.

Cases: the ``attention`` group of :mod:`mmcirc.benchmark.cases` (C = 64, batch 1).
Per (map size, mode): on the CPU each method's peak memory in a fresh child (RSS above
the RSS after setup), then one child times all methods round-robin (``--repeat``
rounds, at least 2 runs, ``--max-seconds`` per method and size); on CUDA the timing
child also reads the allocator's peak per method. ``--amp bf16``: torch.autocast, the
circulant FFTs and softmax stay in float32.

Writes ``DIR/results.json`` (merged with earlier runs of the same device, precision and
threads), ``DIR/table.md`` and ``DIR/benchmark.png`` / ``DIR/benchmark_memory.png``.
"""

import os.path as osp

from ..cases import ATTENTION_DIM, group
from ..report import ResultStore, device_name, environment, markdown_table, plot_series
from ..tasks import measure

METHODS = tuple(group('attention'))
SDPA_N2_CAP = 4 << 30  # skip CPU SDPA once one fp32 N x N score map exceeds 4 GiB
MAX_SECONDS_PER_MEASUREMENT = 60.0


def _get(results, method, size, mode, key='time_ms'):
    r = results.get(f'{method}|{size}|{mode}')
    return None if r is None or key not in r else r[key]


def targets(results, device='cpu'):
    """The acceptance targets as (description, value, verdict) rows (verdicts on the
    CPU, where they are set; information elsewhere)."""

    def ratio(m1, s1, m2, s2, mode='fwd', key='time_ms'):
        a, b = _get(results, m1, s1, mode, key), _get(results, m2, s2, mode, key)
        return None if a is None or b is None or not b else a / b

    def at_least(x):
        return lambda v: v >= x

    def at_most(x):
        return lambda v: v <= x

    checks = [
        (
            '128^2 fwd time: SDPA / circulant (circular) >= 50',
            ratio('sdpa', 128, 'circ-circ', 128),
            at_least(50),
        ),
        ('128^2 fwd time: SDPA / circulant (zero)', ratio('sdpa', 128, 'circ-zero', 128), None),
        (
            '128^2 fwd time: circulant (circular) / its linears <= 1.5',
            ratio('circ-circ', 128, 'circ-linears', 128),
            at_most(1.5),
        ),
        (
            '128^2 fwd time: circulant (zero) / its linears',
            ratio('circ-zero', 128, 'circ-linears', 128),
            None,
        ),
        (
            '128^2 fwd+bwd time: circulant (circular) / its linears',
            ratio('circ-circ', 128, 'circ-linears', 128, 'fwd+bwd'),
            None,
        ),
    ]
    checks += [
        (
            f'{s}^2 fwd time: circulant (zero) / circulant (circular) <= 2',
            ratio('circ-zero', s, 'circ-circ', s),
            at_most(2),
        )
        for s in (128, 256)
    ]
    checks += [
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


def _fmt(r, key):
    if r is None:
        return '-'
    if 'skipped' in r:
        return r['skipped']
    if r.get('status', 'ok') != 'ok':
        return r['status']
    return f'{r[key]:.1f}' if key in r else '-'


def markdown(results, options, modes):
    amp = 'float32' if options.amp is None else options.amp + ' autocast'
    lines = [
        f'Device: {device_name(options.device)}, C={ATTENTION_DIM}, batch 1, {amp}, '
        f'torch threads={options.threads}. SDPA: 1 head of {ATTENTION_DIM} (+ qkv/proj '
        'Linears); circulant: d=1 (64 heads); core: 1 head. Times in ms: median of '
        'round-robin runs; peak memory in MiB above the setup '
        + (
            'baseline (fresh process per entry).'
            if options.device == 'cpu'
            else 'allocation (CUDA allocator, per method).'
        ),
        '',
    ]
    head = ['method', 'map', 'N'] + [f'{m} {k}' for m in modes for k in ('ms', 'MiB')]
    rows = []
    for size in options.sizes:
        for m in METHODS:
            row = [m, f'{size}x{size}', str(size * size)]
            for mode in modes:
                r = results.get(f'{m}|{size}|{mode}')
                row += [_fmt(r, 'time_ms'), _fmt(r, 'peak_mb')]
            s, t = _get(results, 'sdpa', size, 'fwd'), _get(results, m, size, 'fwd')
            rows.append(row + [f'{s / t:.1f}x' if s and t and m != 'sdpa' else '-'])
    lines.append(markdown_table(head + ['fwd speed-up vs SDPA'], rows))
    target_rows = targets(results, options.device)
    lines += ['', markdown_table(['target', 'value', 'result'], target_rows)]
    return '\n'.join(lines) + '\n'


def run(options):
    """Measure every method at every size and mode, write the results, table and plots.

    ``options``: the suite's settings as attributes, those of its command's flags
    (``python -m mmcirc.benchmark attention``, which checks them).
    """
    import torch

    options.threads = options.threads or torch.get_num_threads()
    precision = options.amp or 'fp32'
    options.amp = {'bf16': 'bfloat16', 'fp16': 'float16', None: None}[options.amp]
    modes = ['fwd'] if options.no_backward else ['fwd', 'fwd+bwd']
    store = ResultStore(osp.join(options.out_dir, 'results.json'))
    if not options.fresh:
        store.load(settings=dict(device=options.device, amp=options.amp, threads=options.threads))
    results = store.results
    for size in options.sizes:
        for mode in modes:
            methods = list(options.methods)
            # CPU SDPA materialises the N x N scores; CUDA's kernels do not
            if (
                'sdpa' in methods
                and options.device == 'cpu'
                and (size * size) ** 2 * 4 > SDPA_N2_CAP
            ):
                methods.remove('sdpa')
                results[f'sdpa|{size}|{mode}'] = {'skipped': 'skipped (N^2 memory)'}
            spec = dict(
                hw=[size, size],
                device=options.device,
                threads=options.threads,
                precision=precision,
                backward=mode == 'fwd+bwd',
                repeat=options.repeat,
                budget_s=options.max_seconds,
                min_runs=2,
            )
            for m, r in measure(methods, spec, timeout=options.timeout).items():
                results[f'{m}|{size}|{mode}'] = r
            for m in options.methods:
                r = results[f'{m}|{size}|{mode}']
                msg = r.get('skipped') or (
                    f'{r["status"]}: {r.get("error", "")}'
                    if r['status'] != 'ok'
                    else f'{r["time_ms"]:10.1f} ms {r["peak_mb"]:9.1f} MiB'
                    + ('' if r.get('finite', True) else '  NON-FINITE OUTPUT')
                )
                print(f'{m:>13s} {size:4d}x{size:<4d} {mode:8s} {msg}', flush=True)
            store.save(environment=environment(device=options.device))
    table = markdown(results, options, modes)
    sizes = sorted({int(k.split('|')[1]) for k in results} | set(options.sizes))
    store.save(
        device=options.device,
        dim=ATTENTION_DIM,
        threads=options.threads,
        sizes=sizes,
        amp=options.amp,
        device_name=device_name(options.device),
        targets=targets(results, options.device),
    )
    from mmcirc.utils.fileio import atomic_write

    atomic_write(osp.join(options.out_dir, 'table.md'), table)
    title = f'Attention cost, C={ATTENTION_DIM}, batch 1, {options.amp or "fp32"}, {device_name(options.device)}'
    for key, label, name in (
        ('time_ms', 'time [ms]', 'benchmark'),
        ('peak_mb', 'peak memory [MiB]', 'benchmark_memory'),
    ):
        series = {
            f'{m} {mode}': [(s * s, _get(results, m, s, mode, key)) for s in sizes]
            for m in METHODS
            for mode in modes
        }
        if (
            plot_series(
                series, osp.join(options.out_dir, f'{name}.png'), 'N = H*W tokens', label, title
            )
            is None
        ):
            print('matplotlib not installed: no PNG written')
            break
    print()
    print(table)
