"""Suite ``launches``: compute operators dispatched per eager forward, and the host time
of a forward at a tiny input, for each mmcirc model beside its peer.

On a GPU an eager forward launches about one kernel per compute operator, and each costs
the host ~30 us whatever its size: at the sizes users run, the operator count predicts the
eager forward time where the GPU work is small. Both are measured here on the CPU:

* ``ops``: the aten operators one forward dispatches (``torch.utils._python_dispatch.
  TorchDispatchMode``), less views (``OpOverload.is_view`` and ``_unsafe_view``) and bare
  allocations (``empty*``): no kernel runs for them; ``casts``: those that are dtype casts
  (``aten._to_copy``);
* ``host ms``: the median time of a forward at 64 px (``--host-size``), where the work is
  tiny and the time is the Python and dispatch overhead, measured without the counter.

Each model runs on both layouts of :mod:`mmcirc.ops.settings` (``cuda``: the path a CUDA
tensor takes, run on CPU tensors; ``cpu``), in float32 and under bfloat16 autocast, at
each size (``--sizes``), batch 1, random weights, eval mode, no grad. The peers (timm's
DeiT-T, mmdet's PVT-S and Swin-T) have one path: they run once per precision and size.
The models with the Triton kernel (:data:`KERNEL_MODELS`) run on the ``cuda`` layout
only, their kernel in Triton's interpreter (``TRITON_INTERPRET=1``, set for the process
when one is measured), and without a host time (the interpreter's is no GPU's).

Writes ``DIR/results.json`` and ``DIR/table.md`` after every model.
"""

import os
from collections import Counter

from ..cases import case
from ..grid import at_least, known, parse_hw, run_grid
from ..measurement import pin_threads, precision_context, round_robin
from ..report import markdown_table, ratio

SHARED = dict(out_dir=None, threads=1, repeat=20, fresh=False)

#: model -> its peer
PAIRS = {'ca_deit_t': 'deit_t', 'ca_deit_t_triton': 'deit_t', 'circ_pvt_s': 'pvt_s',
         'ca_pvt_s': 'pvt_s', 'core_pvt_s': 'pvt_s', 'ca_swin_t': 'swin_t'}  # fmt: skip
MODELS = tuple(PAIRS) + tuple(dict.fromkeys(PAIRS.values()))
#: the models whose circulant attention runs the Triton kernel (``kernel='triton'``)
KERNEL_MODELS = ('ca_deit_t_triton',)
LAYOUTS = ('cuda', 'cpu')
PRECISIONS = ('fp32', 'bf16')
DEFAULT_SIZES = ['64', '224', '1024']
MULTIPLE = 32
#: no kernel runs: allocations, and a view torch does not declare one
_NO_KERNEL = ('empty', 'empty_like', 'new_empty', 'new_empty_strided', 'empty_strided',
              '_unsafe_view')  # fmt: skip


def count_ops(fn, *args):
    """``fn(*args)`` once under a dispatch counter: ``(output, Counter of compute ops by
    name)``, views and allocations left out."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and func._opname not in _NO_KERNEL:
                seen[func._opname] += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        out = fn(*args)
    return out, seen


def measure(name, hw, layout, precision, host_size, repeat) -> dict:
    """One model at ``hw`` on ``layout`` in ``precision``: its op counts, and (at the
    host size) the median forward time."""
    import torch

    from mmcirc.ops.settings import forced_layout

    kernel = name in KERNEL_MODELS
    if kernel:  # read when the kernels are defined (on their first use)
        os.environ['TRITON_INTERPRET'] = '1'
    model, call, x = case(name).build(hw)
    model.eval()
    with torch.no_grad(), forced_layout(layout), precision_context('cpu', precision):
        _, ops = count_ops(call, x)
        if kernel and not ops['circulant_core']:
            raise RuntimeError(f'{name}: the Triton kernel did not run at {hw[0]} px')
        res = dict(ops=sum(ops.values()), casts=ops['_to_copy'], top=ops.most_common(8))
        if hw == (host_size, host_size) and not kernel:  # after 3 warm-up calls
            timing = round_robin({name: lambda: call(x)}, repeat=repeat, warmup=3)
            res['host_ms'] = timing[name]['time_ms']
    return res


def key(name, size, layout, precision):
    return f'{name}|{size}|{layout}|{precision}'


def _layouts(name):
    return ('cuda',) if name in KERNEL_MODELS else LAYOUTS


def _cell(results, name, size, layout, precision, field):
    lay = layout if name in PAIRS else 'any'
    return results.get(key(name, size, lay, precision), {}).get(field)


def table(results: dict, sizes, host_size) -> str:
    """Per (model, layout): ops at each size and precision against its peer's, and the
    host time at ``host_size`` against the peer's."""
    head = ['model (peer)', 'layout']
    for p in PRECISIONS:
        head += [f'ops {s} px {p}' for s in sizes]
    head += [f'casts {s} px bf16' for s in sizes]
    head += [f'host ms {host_size} px fp32', f'host ms {host_size} px bf16']
    rows = []
    for name, peer in PAIRS.items():
        for layout in _layouts(name):
            row = [f'{case(name).label} ({case(peer).label})', layout]

            def pair(field, size, precision):
                a = _cell(results, name, size, layout, precision, field)
                b = _cell(results, peer, size, layout, precision, field)
                if a is None or b is None:
                    return '-'
                fmt = '{:.1f}' if isinstance(a, float) else '{}'
                return f'{fmt.format(a)} / {fmt.format(b)} ({ratio(a, b)}x)'

            row += [pair('ops', s, p) for p in PRECISIONS for s in sizes]
            row += [pair('casts', s, 'bf16') for s in sizes]
            row += [pair('host_ms', host_size, p) for p in PRECISIONS]
            rows.append(row)
    return (
        'Compute ops per eager forward (views and allocations not counted) and host time '
        f'of one forward at {host_size} px, model / peer (ratio); batch 1, no grad; '
        'layout `cuda` is the path of a CUDA tensor (`MMCIRC_LAYOUT=cuda`), run on the CPU.\n\n'
        + markdown_table(head, rows, 'll' + 'r' * (len(head) - 2))
        + '\n'
    )


def add_arguments(p):
    p.add_argument('--models', nargs='+', default=list(PAIRS), metavar='MODEL',
                   help=f'from {list(PAIRS)} (each beside its peer)')  # fmt: skip
    p.add_argument('--sizes', nargs='+', default=DEFAULT_SIZES, metavar='S')
    p.add_argument('--host-size', type=int, default=64, help='the size of the host time')


def check(options):
    known(options.models, PAIRS, '--models')
    at_least(options, ['repeat', 'threads', 'host_size'])
    options.sizes = [parse_hw(s, '--sizes', MULTIPLE) for s in options.sizes]
    if any(h != w for h, w in options.sizes):
        raise ValueError(f'--sizes must be square sizes S, got {options.sizes}')
    if (options.host_size, options.host_size) not in options.sizes:
        raise ValueError(f'--host-size {options.host_size} must be one of --sizes')


def run(options):
    """Every model (and its peer) at every size, layout and precision; the results and
    the table written after each model (``options``: the flags, checked by :func:`check`)."""
    pin_threads(options.threads)
    sizes = [hw[0] for hw in options.sizes]
    names = [m for m in options.models if m in PAIRS]
    peers = list(dict.fromkeys(PAIRS[m] for m in names))

    def measure_model(name, store):
        layouts = _layouts(name) if name in PAIRS else ('any',)
        return {
            key(name, hw[0], layout, precision): measure(
                name, hw, None if layout == 'any' else layout, precision,
                options.host_size, options.repeat,
            )
            for hw in options.sizes
            for layout in layouts
            for precision in PRECISIONS
        }  # fmt: skip

    settings = dict(threads=options.threads, sizes=sizes, host_size=options.host_size)
    store = run_grid(
        options, names + peers, measure_model,
        lambda store: table(store.results, sizes, options.host_size), settings=settings,
    )  # fmt: skip
    return store.results
