"""Suite ``backbone``: forward time and peak memory of mmcirc's pyramids against mmdet's
/ mmseg's PVT-S and Swin-T, side by side over input sizes (batch 1 and float32 unless
``--batch`` / ``--precisions``; no grad, eval mode; ``--backward``: the training step,
forward + backward of the outputs' sum, instead).

Per size, the models of that size are measured together: on the CPU each one's peak
memory in a fresh child (peak RSS above the RSS with the model and input built: what
the forward adds; CUDA: the allocator's peak), then one child times them round-robin
(at most ``--repeats`` runs, at least ``--min-repeats``, ``--budget`` seconds of timed
runs per model; a first forward slower than ``--single-run-above`` seconds is the
measurement, marked ``*``). ``--timeout`` bounds each child (the timing child: times
the number of models); a model that times out or runs out of memory at one size is not
tried at larger sizes. ``--flops`` adds the counted multiply-adds.

Writes ``DIR/results_<stem>.json`` (merged with earlier runs), ``DIR/table_<stem>.md``
and ``DIR/{time,memory}_<stem>.png``; ``<stem>``: the device, then ``_bf16`` / ``_fp16``
and ``_b<N>`` where not float32 / batch 1, ``_fwdbwd`` with ``--backward``
(``--precisions fp32 bf16``: two tables).
"""

import os
import os.path as osp

from ..cases import CASES, group
from ..report import ResultStore, environment, markdown_table, plot_series, ratio
from ..tasks import measure

ZOO = group('backbone')
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


def _key(r):
    return f'{r["model"]}|{r["size"]}'


def record(model, size, device, r, load):
    """A measurement of :func:`mmcirc.benchmark.tasks.measure` in this table's layout
    (seconds, MB)."""
    out = dict(model=model, size=size, device=device, status=r['status'])
    if r['status'] != 'ok':
        return dict(out, note=r.get('error', ''))
    out.update(
        threads=r.get('threads'),
        params=r.get('params'),
        time_s=r['time_ms'] / 1e3,
        warmup_s=r.get('memory_first_ms', r['first_ms']) / 1e3,
        runs=r['runs'],
        times_s=[t / 1e3 for t in r['times_ms']],
        warmup_only=r['warmup_only'],
        mem_mb=r.get('peak_mb'),
        build_s=r.get('build_s'),
        finite=r.get('finite'),
        dtype=r.get('dtype'),
        load_before=load[0],
        load_after=load[1],
    )
    if 'macs' in r:
        out['flops'] = r['macs']
    if 'flops_error' in r:
        out['flops_error'] = r['flops_error']
    return out


def table(results, models, sizes):
    """Markdown table: time, memory, FLOPs and ratios against each model's baseline."""
    by = {(r['model'], r['size']): r for r in results}
    rows = []
    for size in sizes:
        for m in models:
            r = by.get((m, size))
            if r is None:
                continue
            base = CASES[m].baseline
            b = by.get((base, size)) if base else None
            ok = r['status'] == 'ok' and b is not None and b['status'] == 'ok'
            if r['status'] != 'ok':
                t, mem = r['status'], '-'
            else:
                t = f'{r["time_s"]:.3f}' + ('*' if r.get('warmup_only') else '')
                mem = f'{r["mem_mb"]:.0f}'
            if ok:
                speed = ratio(b['time_s'], r['time_s'], suffix='x')
            else:
                speed = f'> {b["note"]}' if b is not None and b['status'] == 'timeout' else '-'
            rows.append(
                [
                    size,
                    CASES[m].label,
                    t,
                    mem,
                    f'{r["flops"] / 1e9:.1f}' if r.get('flops') else '-',
                    speed,
                    ratio(r['mem_mb'], b['mem_mb']) if ok and b['mem_mb'] > 0 else '-',
                    f'{r["load_before"]:.1f}' if 'load_before' in r else '-',
                ]
            )
    head = [
        'size',
        'model',
        'time (s)',
        'peak mem (MB)',
        'GMACs',
        'speed-up vs baseline',
        'mem / baseline',
        'load',
    ]
    return markdown_table(head, rows, 'rlrrrrrr') + (
        '\n\n`*` one run (its warm-up), the measurement was too slow to repeat. '
        'load: 1-min load average before the measurement (CPU timings are only '
        'clean near 0 on an otherwise idle machine).'
    )


def run(options):
    """One table per precision: every size and model.

    ``options``: the suite's settings as attributes, those of its command's flags
    (``python -m mmcirc.benchmark backbone``, which checks them).
    """
    if options.device is None:
        import torch

        options.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    os.makedirs(options.out_dir, exist_ok=True)
    for precision in options.precisions:
        run_precision(options, precision)


def run_precision(options, precision):
    """One table: every size and model at ``precision``."""
    stem = options.device + ('' if precision == 'fp32' else f'_{precision}')
    stem += '' if options.batch == 1 else f'_b{options.batch}'
    stem += '_fwdbwd' if options.backward else ''
    store = ResultStore(osp.join(options.out_dir, f'results_{stem}.json'), True, _key)
    if not options.fresh:
        store.load()
    store.drop(f'{m}|{s}' for m in options.models for s in options.sizes)
    spec = dict(
        device=options.device,
        precision=precision,
        batch=options.batch,
        backward=options.backward,
        threads=options.threads or None,
        repeat=options.repeats,
        min_runs=options.min_repeats,
        budget_s=options.budget,
        single_run_above=options.single_run_above,
        flops='direct' if options.flops else None,
    )
    for size in sorted(options.sizes):  # size-major: the models of one size side by side
        failed = {
            r['model']
            for r in store.results.values()
            if r['size'] < size and r['status'] in ('timeout', 'oom')
        }
        for m in options.models:
            if m in failed:
                store.update(
                    {
                        f'{m}|{size}': dict(
                            model=m,
                            size=size,
                            device=options.device,
                            status='skipped',
                            note='smaller size did not finish',
                        )
                    }
                )
        todo = [m for m in options.models if m not in failed]
        load = os.getloadavg()[0]
        res = measure(todo, dict(spec, hw=[size, size]), timeout=options.timeout) if todo else {}
        for m, r in res.items():
            rec = record(m, size, options.device, r, (load, os.getloadavg()[0]))
            rec['step'] = 'forward+backward' if options.backward else 'forward'
            store.update({_key(rec): rec})
            msg = (
                f'{rec["time_s"]:.3f} s ({rec["runs"]} runs), {rec["mem_mb"]:.0f} MB'
                if rec['status'] == 'ok'
                else f'{rec["status"]} {rec.get("note", "")}'
            )
            print(f'[{size}, {precision}] {m}: {msg}', flush=True)
        env = environment(device=options.device, precision=precision, batch=options.batch)
        store.save(device=options.device, environment=env)
    results = list(store.results.values())
    models = [m for m in ZOO if any(r['model'] == m for r in results)]
    md = table(results, models, sorted({r['size'] for r in results}))
    print('\n' + md)
    from mmcirc.utils.fileio import atomic_write

    atomic_write(osp.join(options.out_dir, f'table_{stem}.md'), md + '\n')
    for key, ylabel, name in (
        ('time_s', 'forward time (s)', 'time'),
        ('mem_mb', 'peak memory added by forward (MB)', 'memory'),
    ):
        series = {
            CASES[m].label: [
                (r['size'], r.get(key)) for r in results if r['model'] == m and r['status'] == 'ok'
            ]
            for m in models
        }
        styles = {CASES[m].label: '--o' if CASES[m].baseline is None else '-o' for m in models}
        path = plot_series(
            series,
            osp.join(options.out_dir, f'{name}_{stem}.png'),
            'input size (px, square)',
            ylabel,
            f'backbone {"forward + backward" if options.backward else "forward"}, '
            f'batch {options.batch}, {precision}, {options.device}',
            log_base_x=2,
            styles=styles,
        )
        if path:
            print('wrote', path)
    print('wrote', store.path)
