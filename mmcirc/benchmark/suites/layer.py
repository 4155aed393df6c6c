"""Suite ``layer``: one attention layer (global softmax SDPA, circulant on the FFT path or
with the Triton kernel of its core, core attention) on square token maps, time and peak
memory against N = H*W, with the CPU acceptance targets.

Cases: the ``attention`` group of :mod:`mmcirc.benchmark.cases` (``--dim`` channels,
default 64, ``--batch`` maps). Per (map size, step: ``fwd``, and unless ``--no-backward``
``fwd+bwd``) the layers are measured together (:func:`mmcirc.benchmark.tasks.measure`):
on the CPU each one's peak memory in a fresh child (RSS above the RSS after setup), then
one child times them round-robin (``--repeat`` rounds after ``--warmup`` calls, at least
2 runs, ``--max-seconds`` per layer and size); on CUDA the timing child also reads the
allocator's peak per layer; ``--in-process``: no children (no CPU memory).
``--precision``: torch.autocast (the circulant FFTs and softmax stay in float32; SDPA
pinned to the flash kernel on CUDA). CPU SDPA is skipped
where one float32 N x N score map exceeds 4 GiB. ``--errors``: each circulant layer's
largest difference from the FFT path in float64 on the same input, over the largest
value of that reference. The Triton kernel (``kernel-ieee`` / ``kernel-tf32``) runs on
the CPU in Triton's interpreter (``TRITON_INTERPRET=1``, set here): a rehearsal of its
code paths at tiny sizes, not a timing.

Writes ``DIR/results_<device>.json`` (merged with earlier runs of the same settings) and
``DIR/table_<device>.md`` after every cell.
"""

import os

from ..cases import LAYERS, case, group
from ..grid import at_least, resolve_device, run_grid
from ..measurement import PRECISIONS, precision_context
from ..report import device_name, figure, markdown_table
from ..tasks import measure as measure_cases

SHARED = dict(out_dir=None, threads=None, repeat=5, timeout=None, fresh=False, device='cpu')
METHODS = tuple(group('attention'))
SDPA_N2_CAP = 4 << 30  # skip CPU SDPA once one fp32 N x N score map exceeds 4 GiB
KERNEL_SIDE = 64  # the Triton kernel's largest map side


def add_arguments(p):
    p.add_argument('--methods', nargs='+', default=list(LAYERS), choices=METHODS)
    p.add_argument('--sizes', nargs='+', type=int, default=[32, 64, 128, 256, 512],
                   help='map sides H = W')  # fmt: skip
    p.add_argument('--max-seconds', type=float, default=60.0,
                   help='timed seconds per layer and size (at least 2 runs)')  # fmt: skip
    p.add_argument('--precision', default='fp32', choices=tuple(PRECISIONS), help='autocast')
    p.add_argument('--no-backward', action='store_true', help='forward only')
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--dim', type=int, default=64, help='channels C (CA-DeiT-T: 192)')
    p.add_argument('--warmup', type=int, default=1, help='untimed calls before the timed runs')
    p.add_argument('--errors', action='store_true', help='circulant layers against float64')
    p.add_argument('--in-process', action='store_true', help='no child processes (GPU grids)')


def check(options):
    at_least(options, ['sizes', 'repeat', 'threads', 'batch', 'dim', 'warmup'])
    kernel = [m for m in options.methods if m.startswith('kernel-')]
    if kernel and max(options.sizes) > KERNEL_SIDE:
        raise ValueError(f'--sizes must be <= {KERNEL_SIDE} with {kernel}, got {options.sizes}')
    resolve_device(options)
    if kernel and options.device == 'cpu':
        os.environ['TRITON_INTERPRET'] = '1'  # read when the kernel is defined (children too)


def errors(methods, size, options) -> dict:
    """{layer: its forward's error against the FFT path in float64} (see the docstring)."""
    import copy

    import torch

    from mmcirc.ops import CirculantAttention

    out, hw = {}, (size, size)
    for name in methods:
        layer, call, x = case(name).build(hw, options.batch, device=options.device, dim=options.dim)
        if not isinstance(layer, CirculantAttention) or name == 'circ-linears':
            continue
        layer.eval()
        if layer.kernel == 'triton' and layer._plan(x, hw).core is None:
            raise RuntimeError(f'{name}: the Triton kernel does not run on {x.device} at {hw}')
        ref = copy.deepcopy(layer).double()
        ref.kernel = 'torch'
        with torch.no_grad():
            r = ref(x.double(), hw)
            with precision_context(x.device, options.precision):
                y = call(x)
        out[name] = ((y.double() - r).abs().max() / r.abs().max()).item()
    return out


def run(options):
    """Every layer at every size and step (``options``: the flags, checked by :func:`check`)."""
    import torch

    options.threads = options.threads or torch.get_num_threads()
    modes = ['fwd'] if options.no_backward else ['fwd', 'fwd+bwd']
    settings = dict(device=options.device, precision=options.precision,
                    threads=options.threads, batch=options.batch, dim=options.dim)  # fmt: skip
    spec = dict(settings, repeat=options.repeat, budget_s=options.max_seconds, min_runs=2,
                warmup=options.warmup)  # fmt: skip

    def measure(cell, store):
        size, mode = cell
        methods, out = list(options.methods), {}
        # CPU SDPA materialises the N x N scores; CUDA's kernels do not
        if 'sdpa' in methods and options.device == 'cpu' and (size * size) ** 2 * 4 > SDPA_N2_CAP:
            methods.remove('sdpa')
            out[f'sdpa|{size}|{mode}'] = dict(status='skipped', error='N^2 memory')
        cell_spec = dict(spec, hw=[size, size], backward=mode == 'fwd+bwd')
        errs = errors(methods, size, options) if options.errors and mode == 'fwd' else {}
        res = measure_cases(methods, cell_spec, timeout=options.timeout,
                            in_process=options.in_process)  # fmt: skip
        for m, r in res.items():
            out[f'{m}|{size}|{mode}'] = dict(r, **({'rel_error': errs[m]} if m in errs else {}))
        return out

    cells = [(size, mode) for size in options.sizes for mode in modes]
    store = run_grid(
        options, cells, measure, lambda store: table(store, options, modes),
        name=f'results_{options.device}', settings=settings,
    )  # fmt: skip
    return store.results


def _get(results, method, size, mode, key='time_ms'):
    r = results.get(f'{method}|{size}|{mode}')
    return None if r is None or r['status'] != 'ok' else r.get(key)


def targets(results, device='cpu'):
    """The acceptance targets as (description, value, verdict) rows (verdicts on the
    CPU, where they are set; information elsewhere)."""

    def ratio(m1, s1, m2, s2, mode='fwd', key='time_ms'):
        a, b = _get(results, m1, s1, mode, key), _get(results, m2, s2, mode, key)
        return None if a is None or b is None or not b else a / b

    least, most = (lambda x: lambda v: v >= x), (lambda x: lambda v: v <= x)
    checks = [
        ('128^2 fwd time: SDPA / circulant (circular) >= 50',
         ratio('sdpa', 128, 'circ-circ', 128), least(50)),
        ('128^2 fwd time: SDPA / circulant (zero)', ratio('sdpa', 128, 'circ-zero', 128), None),
        ('128^2 fwd time: circulant (circular) / its linears <= 1.5',
         ratio('circ-circ', 128, 'circ-linears', 128), most(1.5)),
        ('128^2 fwd time: circulant (zero) / its linears',
         ratio('circ-zero', 128, 'circ-linears', 128), None),
        ('128^2 fwd+bwd time: circulant (circular) / its linears',
         ratio('circ-circ', 128, 'circ-linears', 128, 'fwd+bwd'), None),
    ]  # fmt: skip
    checks += [(f'{s}^2 fwd time: circulant (zero) / circulant (circular) <= 2',
                ratio('circ-zero', s, 'circ-circ', s), most(2)) for s in (128, 256)]  # fmt: skip
    checks += [
        ("128^2 fwd time: SDPA / core (C'=64) >= 20", ratio('sdpa', 128, 'core-64', 128),
         least(20)),
        ("256^2 fwd time: core C'=64 / C'=8 >= 3", ratio('core-64', 256, 'core-8', 256), least(3)),
    ]  # fmt: skip
    checks += [(f'{m} {mode}: peak memory 256^2 / 128^2 <= 4.5',
                ratio(m, 256, m, 128, mode, 'peak_mb'), most(4.5))
               for m in ('circ-circ', 'circ-zero', 'core-8', 'core-64')
               for mode in ('fwd', 'fwd+bwd')]  # fmt: skip

    def verdict(v, ok):
        return 'info' if ok is None or device != 'cpu' else 'PASS' if ok(v) else 'FAIL'

    return [(d, 'n/a', 'not measured') if v is None else (d, f'{v:.2f}', verdict(v, ok))
            for d, v, ok in checks]  # fmt: skip


def table(store, options, modes):
    """Per layer and size each step's time (ms) and memory (MiB), the speed-up against
    SDPA, the error; then the targets (also kept in the store)."""
    results = store.results
    store.extra['targets'] = target_rows = targets(results, options.device)
    head = ['method', 'map', 'N'] + [f'{m} {k}' for m in modes for k in ('ms', 'MiB')]
    head += ['fwd speed-up vs SDPA', 'error vs float64']
    rows = []
    for size in options.sizes:
        for m in options.methods:
            row = [m, f'{size}x{size}', str(size * size)]
            for mode in modes:
                r = results.get(f'{m}|{size}|{mode}')
                row += [figure(r, 'time_ms'), figure(r, 'peak_mb')]
            s, t = _get(results, 'sdpa', size, 'fwd'), _get(results, m, size, 'fwd')
            err = _get(results, m, size, 'fwd', 'rel_error')
            row += [f'{s / t:.1f}x' if s and t and m != 'sdpa' else '-']
            rows.append(row + ['-' if err is None else f'{err:.1e}'])
    return (
        f'Device: {device_name(options.device)}, C={options.dim}, batch {options.batch}, '
        f'{options.precision}, torch threads={options.threads}. Times in ms: median of '
        'round-robin runs; peak memory in MiB above the setup '
        + ('(fresh process per entry).' if options.device == 'cpu' else '(CUDA allocator).')
        + '\n\n' + markdown_table(head, rows)
        + '\n\n' + markdown_table(['target', 'value', 'result'], target_rows)
    )  # fmt: skip
