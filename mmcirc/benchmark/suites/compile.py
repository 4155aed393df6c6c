"""Suite ``compile``: eager against ``torch.compile`` for one backbone of each family,
side by side in one run: forward time, the speed-up, the first call's compile time, graph
breaks and the compiled output's difference from eager.

Backbones (registered cases, by class, random weights, eval mode): ``ca_pvt_t`` CAPVT
tiny, ``core_pvt_t`` CorePVT tiny (C' = 64), ``ca_swin_t`` CASwin tiny, ``ca_deit_t``
CADeiT tiny, ``veca_s`` VECAViT small (C' = 64). Per (backbone, size), in this process:
``torch._dynamo.explain`` counts graphs and breaks; the compiled step's first call
compiles (``first call``: compile plus one run); then eager and compiled forwards
alternate (round-robin, ``--repeat`` timed calls each after a warm-up), times are
medians. ``max rel diff``: ``max |compiled - eager| / max |eager|`` over the outputs.
``--backend eager`` / ``aot_eager`` only capture the graph (smoke tests).

Writes ``DIR/results.json`` and ``DIR/table.md``, atomically after every measurement.
"""

import os.path as osp
import time

from ..cases import case
from ..measurement import COMPILE_MODES, make_step, pin_threads, round_robin
from ..report import ResultStore, environment, markdown_table

#: name -> label of this table
MODELS = {
    'ca_pvt_t': 'CA-PVT-T',
    'core_pvt_t': "Core-PVT-T (C'=64)",
    'ca_swin_t': 'CA-Swin-T',
    'ca_deit_t': 'CA-DeiT-T',
    'veca_s': "VECA-S (C'=64)",
}
BACKENDS = ('inductor', 'aot_eager', 'eager')
MODES = COMPILE_MODES
DEFAULT_SIZES = ['224', '512']
MULTIPLE = 32  # PVT's and Swin's four down-samplings


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def max_rel_diff(out, ref) -> float:
    """max over outputs of max|out - ref| / max|ref|."""
    worst = 0.0
    for o, r in zip(_outputs(out), _outputs(ref)):
        scale = float(r.abs().max()) or 1.0
        worst = max(worst, float((o - r).abs().max()) / scale)
    return worst


def measure(name: str, hw, options) -> dict:
    """Eager vs compiled forward of backbone ``name`` at ``hw`` = (H, W)."""
    import torch

    torch._dynamo.reset()
    model, call, x = case(name).build(hw)
    model.eval()
    with torch.no_grad():
        explain = torch._dynamo.explain(call)(x)
    res = dict(
        graphs=explain.graph_count,
        graph_breaks=explain.graph_break_count,
        break_reasons=[str(r.reason)[:200] for r in explain.break_reasons],
    )
    torch._dynamo.reset()
    kwargs = dict(
        backend=options.backend, mode=options.mode if options.backend == 'inductor' else None
    )
    steps = dict(
        eager=make_step(model, call, x),
        compiled=make_step(model, call, x, compile=kwargs),
    )
    outs = {}
    timed = round_robin(steps, repeat=options.repeat, warmup=2, on_first=outs.__setitem__)
    res.update(
        first_call_s=timed['compiled']['first_ms'] / 1e3,
        max_rel_diff=max_rel_diff(outs['compiled'], outs['eager']),
        shapes=[list(o.shape) for o in _outputs(outs['compiled'])],
        eager_ms=timed['eager']['time_ms'],
        compiled_ms=timed['compiled']['time_ms'],
        eager_times_ms=timed['eager']['times_ms'],
        compiled_times_ms=timed['compiled']['times_ms'],
    )
    res['speedup'] = res['eager_ms'] / res['compiled_ms']
    torch._dynamo.reset()
    return res


def table(results: dict, backend: str, mode: str) -> str:
    rows = []
    for key, r in results.items():
        name, size = key.split('|')
        if 'error' in r:
            rows.append([MODELS[name], size, r['error'], '-', '-', '-', '-', '-'])
            continue
        rows.append(
            [
                MODELS[name],
                size,
                f'{r["eager_ms"]:.1f}',
                f'{r["compiled_ms"]:.1f}',
                f'{r["speedup"]:.2f}x',
                f'{r["first_call_s"]:.1f}',
                f'{r["graphs"]} / {r["graph_breaks"]}',
                f'{r["max_rel_diff"]:.1e}',
            ]
        )
    head = [
        'backbone',
        'size',
        'eager (ms)',
        'compiled (ms)',
        'speed-up',
        'first call (s)',
        'graphs / breaks',
        'max rel diff',
    ]
    return (
        f'torch.compile backend={backend!r}, mode={mode!r}; batch 1, float32, no grad.\n\n'
        + markdown_table(head, rows, 'llrrrrrr')
        + '\n'
    )


def run(options, command: str):
    """Eager against compiled for every model and size; write the results and the table
    after each; ``command``: the command line the results record.

    ``options``: the suite's settings as attributes, those of its command's flags
    (``python -m mmcirc.benchmark compile``, which checks them).
    """
    pin_threads(options.threads)
    env = environment(
        command,
        backend=options.backend,
        mode=options.mode,
    )
    store = ResultStore(osp.join(options.out_dir, 'results.json'))
    for hw in options.sizes:
        for name in options.models:
            t = time.perf_counter()
            key = f'{name}|{hw[0]}x{hw[1]}'
            try:
                r = measure(name, hw, options)
            except Exception as err:  # noqa: BLE001  (a backbone that fails to compile: a row)
                r = dict(error=f'{type(err).__name__}: {str(err).splitlines()[0][:150]}')
            store.update({key: r})
            msg = r.get('error') or (
                f'eager {r["eager_ms"]:.1f} ms, compiled {r["compiled_ms"]:.1f} ms '
                f'({r["speedup"]:.2f}x), first call {r["first_call_s"]:.1f} s, '
                f'{r["graphs"]} graph(s) / {r["graph_breaks"]} break(s), '
                f'max rel diff {r["max_rel_diff"]:.1e}'
            )
            print(
                f'[{hw[0]}x{hw[1]}] {MODELS[name]}: {msg} [{time.perf_counter() - t:.0f} s]',
                flush=True,
            )
            text = table(store.results, options.backend, options.mode)
            store.save(environment=env)
            from mmcirc.utils.fileio import atomic_write

            atomic_write(osp.join(options.out_dir, 'table.md'), text)
    print('\n' + text + f'\nwritten: {osp.join(options.out_dir, "table.md")}')
    return store.results
