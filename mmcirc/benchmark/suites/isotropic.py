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

import importlib.util
import os.path as osp
import time

from ..cases import CASES, count_macs, group
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


def run(options, command: str):
    """Measure (or, ``flops_only``, count) every model at every size; write the results
    and the table after each size; ``command``: the command line the results record.

    ``options``: the suite's settings as attributes, those of its command's flags
    (``python -m mmcirc.benchmark isotropic``, which checks them).
    """
    if any(CASES[m].flash for m in options.models) and importlib.util.find_spec('timm') is None:
        raise ValueError('the DeiT / ViT baselines need timm: pip install timm')
    store = ResultStore(osp.join(options.out_dir, 'results.json'))
    settings = dict(
        depth=options.depth,
        threads=options.threads,
        device=options.device,
        precision=options.precision,
        batch=options.batch,
    )
    if options.flops_only:
        if not osp.isfile(store.path):
            raise FileNotFoundError(
                f'--flops-only: no {store.path} to add the counts to (run the timing first)'
            )
        store.load()
        store.extra['environment']['flops_command'] = command
    elif not options.fresh:
        store.load(settings=settings)
    env = (
        store.extra.get('environment')
        if options.flops_only
        else environment(command, options.device)
    )
    models = order(options.models)
    spec = dict(
        settings,
        repeat=options.repeat,
        single_run_above=options.single_run_above,
        flops='extrapolate' if options.flops else None,
    )
    for hw in options.sizes:
        t = time.perf_counter()
        if options.flops_only:
            res = {}
            for name in models:
                r = dict(store.results.get(f'{name}|{size_label(hw)}', {}))
                r.pop('gmacs_error', None)
                res[name] = dict(r, **flops(name, hw, options.depth))
        else:
            res = {
                n: record(r)
                for n, r in measure(
                    models, dict(spec, hw=list(hw)), timeout=options.timeout
                ).items()
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

        atomic_write(osp.join(options.out_dir, 'table.md'), text)
    print('\n' + text + f'\nwritten: {osp.join(options.out_dir, "table.md")}, {store.path}')
    return store.results
