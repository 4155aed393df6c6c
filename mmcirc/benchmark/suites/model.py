"""Suite ``model``: whole models side by side, mmcirc's against their plain-attention peers:
the pyramids against mmdet's / mmseg's PVT-S and Swin-T, CA-DeiT / VECA against timm's
DeiT / ViT; eager and / or ``torch.compile``, over sizes, batches and precisions.

Cases: the ``backbone`` and ``isotropic`` groups of :mod:`mmcirc.benchmark.cases` (random
weights, eval mode, no grad; ``--backward``: the training step, forward + backward of the
outputs' sum; ``--depth``: the first blocks of an isotropic model). The grid: batch,
precision (autocast; the plain-attention models' SDPA pinned to the flash kernel under
half precision on CUDA), size, mode (``eager``, ``compile``: ``torch.compile`` with
``--compile-backend`` / ``--compile-mode``, one static graph per size, up to
``--compile-max-size``). Per cell the models are measured together
(:func:`mmcirc.benchmark.tasks.measure`): on the CPU, eager, each one's peak memory in a
fresh child (what the forward adds above the built model and input; CUDA: the
allocator's peak over one more call), then one child times them round-robin (at most
``--repeat`` runs after ``--warmup`` calls, at least ``--min-repeats``, ``--budget``
seconds of timed runs per model; a first call slower than ``--single-run-above`` seconds
is the measurement, marked ``*``; a compiled model's first call is its compile).
``--in-process``: no children (a GPU's grid without a process per cell; no CPU memory).
``--timeout`` bounds each child (the timing child: times the number of models); a model
that times out or runs out of memory is not tried at larger sizes. ``--flops`` adds the
counted multiply-adds; ``--explain`` (with ``compile``) dynamo's graphs and breaks and the
compiled output's largest difference from eager; ``--total-budget``: no cell starts after
that many seconds (the rest is listed as not measured).

Writes ``DIR/results_<device>.json`` (``_fwdbwd`` with ``--backward``; merged with earlier
runs of the same settings) and ``DIR/table_<device>.md`` after every cell.
"""

import importlib.util
import itertools
import os
from typing import NamedTuple

from ..cases import CASES, group
from ..grid import at_least, parse_hw, positive, resolve_device, run_grid
from ..measurement import COMPILE_BACKENDS, COMPILE_MODES, PRECISIONS
from ..report import figure, markdown_table, speedup
from ..tasks import measure as measure_cases

SHARED = dict(out_dir=None, threads=None, repeat=10, timeout=300.0, fresh=False, device=None)
MODELS = group('backbone') + group('isotropic')
DEFAULT_MODELS = ['pvt_s', 'circ_pvt_s', 'core_pvt_s', 'ca_pvt_s', 'swin_t', 'swin_t_mmseg',
                  'ca_swin_t']  # fmt: skip
MODES = ('eager', 'compile')


def add_arguments(p):
    p.add_argument('--models', nargs='+', default=DEFAULT_MODELS, choices=MODELS, metavar='MODEL',
                   help=f'from {MODELS}')  # fmt: skip
    p.add_argument('--sizes', nargs='+', default=['224', '512', '1024', '1536', '2048'],
                   metavar='S|HxW')  # fmt: skip
    p.add_argument('--batches', nargs='+', type=int, default=[1])
    p.add_argument('--precisions', nargs='+', default=['fp32'], choices=tuple(PRECISIONS))
    p.add_argument('--modes', nargs='+', default=['eager'], choices=MODES)
    p.add_argument('--backward', action='store_true', help='time forward + backward (_fwdbwd)')
    p.add_argument('--flops', action='store_true', help='also count the multiply-adds')
    p.add_argument('--depth', type=int, help='keep the first DEPTH blocks (isotropic models)')
    p.add_argument('--warmup', type=int, default=1, help='untimed calls before the timed runs')
    p.add_argument('--min-repeats', type=int, default=1, help='fewest timed runs')
    p.add_argument('--budget', type=float, default=10.0, help='seconds of timed runs per model')
    p.add_argument('--single-run-above', type=float, default=30.0,
                   help='first-call seconds above which that call is the measurement')  # fmt: skip
    p.add_argument('--total-budget', type=float, help='seconds after which no cell starts')
    p.add_argument('--compile-backend', default='inductor', choices=COMPILE_BACKENDS)
    p.add_argument('--compile-mode', default='default', choices=COMPILE_MODES)
    p.add_argument('--compile-max-size', type=int, help='compile cells up to this side')
    p.add_argument('--explain', action='store_true', help='compile: graphs, breaks, difference')
    p.add_argument('--in-process', action='store_true', help='no child processes (GPU grids)')


def check(options):
    multiple = max(CASES[m].multiple for m in options.models)
    options.sizes = [parse_hw(s, '--sizes', multiple) for s in options.sizes]
    names = ['repeat', 'threads', 'batches', 'depth', 'warmup', 'min_repeats', 'compile_max_size']
    at_least(options, names)
    positive(options, ['budget', 'single_run_above', 'timeout', 'total_budget'])
    if options.explain and 'compile' not in options.modes:
        raise ValueError('--explain needs --modes compile')
    if any(CASES[m].flash for m in options.models) and not importlib.util.find_spec('timm'):
        raise ValueError('the DeiT / ViT peers need timm: pip install timm')
    resolve_device(options)


class Cell(NamedTuple):
    batch: int
    precision: str
    size: tuple
    mode: str

    def __str__(self):
        return f'batch {self.batch}, {self.precision}, {self.size[0]}x{self.size[1]}, {self.mode}'


def key(name, cell):
    return f'{name}|{cell.size[0]}x{cell.size[1]}|{cell.batch}|{cell.precision}|{cell.mode}'


def order(models):
    """Each mmcirc model right before its peer (when both are asked for)."""
    out = []
    for name in models:
        out += [n for n in (name, CASES[name].baseline) if n in models and n not in out]
    return out


def run(options):
    """Every cell of the grid (``options``: the flags, checked by :func:`check`)."""
    grid = itertools.product(options.batches, options.precisions, options.sizes, options.modes)
    top = options.compile_max_size
    cells = [Cell(*c) for c in grid if c[3] == 'eager' or top is None or max(c[2]) <= top]
    compile = dict(backend=options.compile_backend)
    if options.compile_backend == 'inductor':
        compile['mode'] = options.compile_mode
    settings = dict(device=options.device, threads=options.threads, depth=options.depth,
                    backward=options.backward)  # fmt: skip
    spec = dict(settings, repeat=options.repeat, warmup=options.warmup,
                min_runs=options.min_repeats, budget_s=options.budget, flops=options.flops,
                single_run_above=options.single_run_above, explain=options.explain)  # fmt: skip
    models = order(options.models)

    def measure(cell, store):
        area = cell.size[0] * cell.size[1]
        failed = set()
        for k, r in store.results.items():
            name, hw, *rest = k.split('|')
            h, w = map(int, hw.split('x'))
            same = rest == key('', cell).split('|')[2:] and h * w < area
            failed |= {name} if same and r['status'] in ('timeout', 'oom') else set()
        out = {key(m, cell): dict(status='skipped', error='a smaller size did not finish')
               for m in models if m in failed}  # fmt: skip
        todo = [m for m in models if m not in failed]
        load = os.getloadavg()[0]
        cell_spec = dict(spec, hw=list(cell.size), batch=cell.batch, precision=cell.precision)
        cell_spec['compile'] = compile if cell.mode == 'compile' else None
        children = options.device == 'cpu' and cell.mode == 'eager'
        res = measure_cases(todo, cell_spec, timeout=options.timeout, memory_children=children,
                            in_process=options.in_process)  # fmt: skip
        for m, r in res.items():
            out[key(m, cell)] = dict(r, load=load)
        return out

    suffix = '_fwdbwd' if options.backward else ''
    store = run_grid(
        options, cells, measure, lambda store: table(store.results, options),
        name=f'results_{options.device}{suffix}', settings=settings,
        budget_s=options.total_budget, **(compile if 'compile' in options.modes else {}),
    )  # fmt: skip
    return store.results


def table(results, options) -> str:
    """Per cell and model: params, GMACs, each mode's time and speed-up against the peer,
    peak memory; with ``compile`` the first call, with ``--explain`` graphs / breaks and
    the difference from eager."""
    modes = [m for m in MODES if m in options.modes]
    head = ['batch', 'precision', 'size', 'model', 'params (M)', 'GMACs']
    head += [f'{h} {m}' for m in modes for h in ('ms', 'speed-up')] + ['peak MiB']
    head += ['first call (s)'] if 'compile' in modes else []
    head += ['graphs / breaks', 'max rel diff'] if options.explain else []
    rows = []
    grid = itertools.product(options.batches, options.precisions, options.sizes)
    for (b, p, s), name in itertools.product(grid, order(options.models)):
        recs = {m: results.get(key(name, Cell(b, p, s, m))) for m in modes}
        if not any(recs.values()):
            continue
        first = next((r for r in recs.values() if r and r['status'] == 'ok'), {})
        row = [b, p, f'{s[0]}x{s[1]}', CASES[name].label]
        row += [f'{first["params"] / 1e6:.2f}' if 'params' in first else '-']
        row += [f'{first["macs"] / 1e9:.2f}' if first.get('macs') else '-']
        for m in modes:
            base = CASES[name].baseline
            b_rec = results.get(key(base, Cell(b, p, s, m))) if base else None
            star = '*' if (recs[m] or {}).get('warmup_only') else ''
            row += [figure(recs[m], 'time_ms', '{:.2f}') + star, speedup(b_rec, recs[m])]
        row += [figure(first or None, 'peak_mb', '{:.0f}')]
        c = recs.get('compile') or {}
        if 'compile' in modes:
            row += [f'{c["first_ms"] / 1e3:.1f}' if 'first_ms' in c else '-']
        if options.explain:
            row += [f'{c["graphs"]} / {c["graph_breaks"]}' if 'graphs' in c else '-']
            row += [f'{c["max_rel_diff"]:.1e}' if 'max_rel_diff' in c else '-']
        rows.append(row)
    step = 'forward + backward' if options.backward else 'forward, no grad'
    depth = '' if options.depth is None else f', {options.depth} blocks'
    mode = f', mode={options.compile_mode!r}' if options.compile_backend == 'inductor' else ''
    compiled = f'; compile: torch.compile(backend={options.compile_backend!r}{mode})'
    compiled = compiled if 'compile' in modes else ''
    return (
        f'{options.device}, {step}{depth}{compiled}. ms: median of the timed runs (`*`: one '
        "run, the first call); speed-up: the peer's time (the plain-attention model of the same "
        "size, batch, precision and mode) over the model's; peak MiB: what the call adds.\n\n"
        + markdown_table(head, rows, 'rlrl' + 'r' * (len(head) - 4))
    )
