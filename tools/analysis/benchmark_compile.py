"""Eager against ``torch.compile`` for one backbone of each family, side by side in
one run: forward time, the speed-up, the first call's compile time, graph breaks and
the compiled output's difference from eager.

    python tools/analysis/benchmark_compile.py [--models ca_pvt_t core_pvt_t ca_swin_t
        ca_deit_t veca_s] [--sizes 224 512] [--backend inductor] [--mode default]
        [--repeat 5] [--threads N] [--out-dir DIR]

Backbones (mmcirc's registered classes, built through mmdet's registry, random
weights, eval mode): ``ca_pvt_t`` CAPVT tiny (circulant stages 1-2, SRA 3-4),
``core_pvt_t`` CorePVT tiny (C' = 64), ``ca_swin_t`` CASwin tiny, ``ca_deit_t``
CADeiT tiny, ``veca_s`` VECAViT small (C' = 64).

For each (backbone, size), in this process: ``torch._dynamo.explain`` counts graphs
and graph breaks; ``torch.compile(model, backend=--backend, mode=--mode,
dynamic=False)`` is called once, which compiles (the reported ``first call``: compile
plus one run); then eager and compiled forwards alternate, ``--repeat`` timed calls
each after one warm-up each (batch 1, float32, ``torch.no_grad``); the times are their
medians, the speed-up eager / compiled. ``max rel diff``: over the backbone's outputs,
``max |compiled - eager| / max |eager|``. Dynamo's caches are reset between backbones
(inductor's on-disk cache is not: a second run of the script compiles faster).

``--backend eager`` / ``aot_eager`` only capture the graph (no code generation): for
smoke tests, where inductor's C++ build would take minutes.
Results: ``DIR/results.json`` and ``DIR/table.md`` (default
``work_dirs/benchmark_compile``), rewritten atomically after every measurement.
"""

import argparse
import datetime
import json
import os.path as osp
import platform
import statistics
import sys
import time

from mmcirc.utils.cli import CLIError, main_guard, parse_hw
from mmcirc.utils.fileio import atomic_write as write_atomic

#: name -> (backbone config for mmdet's MODELS registry, label)
MODELS = {
    'ca_pvt_t': (dict(type='CAPVT', arch='tiny'), 'CA-PVT-T'),
    'core_pvt_t': (dict(type='CorePVT', arch='tiny', num_cores=64), "Core-PVT-T (C'=64)"),
    'ca_swin_t': (dict(type='CASwin', arch='tiny'), 'CA-Swin-T'),
    'ca_deit_t': (dict(type='CADeiT', arch='tiny'), 'CA-DeiT-T'),
    'veca_s': (dict(type='VECAViT', arch='small'), "VECA-S (C'=64)"),
}
BACKENDS = ('inductor', 'aot_eager', 'eager')
MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')
DEFAULT_SIZES = ['224', '512']
#: every backbone takes inputs that are multiples of 32 (PVT's and Swin's four
#: down-samplings; the isotropic ones need 16)
MULTIPLE = 32


def build(name: str):
    """Backbone ``name`` of :data:`MODELS` (random weights, eval mode, CPU)."""
    import logging

    import torch
    from mmengine.logging import MMLogger
    from mmengine.registry import init_default_scope

    import mmcirc  # noqa: F401  (registers the backbones)
    from mmdet.registry import MODELS as REGISTRY

    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = REGISTRY.build(dict(MODELS[name][0]))
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # init_weights logs every parameter at INFO
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)
    model.eval()
    return model


def _outputs(out):
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,))]


def max_rel_diff(out, ref) -> float:
    """max over outputs of max|out - ref| / max|ref|."""
    worst = 0.0
    for o, r in zip(_outputs(out), _outputs(ref)):
        scale = float(r.abs().max()) or 1.0
        worst = max(worst, float((o - r).abs().max()) / scale)
    return worst


def measure(name: str, hw, args) -> dict:
    """Eager vs compiled forward of backbone ``name`` at ``hw`` = (H, W)."""
    import torch

    torch._dynamo.reset()
    model = build(name)
    img = torch.randn(1, 3, *hw)
    res = {}
    with torch.no_grad():
        explain = torch._dynamo.explain(model)(img)
        res.update(
            graphs=explain.graph_count,
            graph_breaks=explain.graph_break_count,
            break_reasons=[str(r.reason)[:200] for r in explain.break_reasons],
        )
        torch._dynamo.reset()
        ref = model(img)  # eager warm-up and reference
        compiled = torch.compile(model, backend=args.backend, mode=args.mode, dynamic=False)
        t = time.perf_counter()
        out = compiled(img)
        res['first_call_s'] = time.perf_counter() - t
        res['max_rel_diff'] = max_rel_diff(out, ref)
        res['shapes'] = [list(o.shape) for o in _outputs(out)]
        compiled(img)  # warm-up after compilation
        eager, comp = [], []
        for _ in range(args.repeat):  # alternate: both see the same machine load
            t = time.perf_counter()
            model(img)
            eager.append(time.perf_counter() - t)
            t = time.perf_counter()
            compiled(img)
            comp.append(time.perf_counter() - t)
    res.update(
        eager_ms=1e3 * statistics.median(eager),
        compiled_ms=1e3 * statistics.median(comp),
        eager_times_ms=[round(1e3 * x, 2) for x in eager],
        compiled_times_ms=[round(1e3 * x, 2) for x in comp],
    )
    res['speedup'] = res['eager_ms'] / res['compiled_ms']
    torch._dynamo.reset()
    return res


def size_label(hw) -> str:
    return f'{hw[0]}x{hw[1]}'


def table(results: dict, backend: str, mode: str) -> str:
    lines = [
        f'torch.compile backend={backend!r}, mode={mode!r}; batch 1, float32, no grad.',
        '',
        '| backbone | size | eager (ms) | compiled (ms) | speed-up | first call (s) | '
        'graphs / breaks | max rel diff |',
        '|---|---|---:|---:|---:|---:|---:|---:|',
    ]
    for key, r in results.items():
        name, size = key.split('|')
        label = MODELS[name][1]
        if 'error' in r:
            lines.append(f'| {label} | {size} | {r["error"]} | - | - | - | - | - |')
            continue
        lines.append(
            f'| {label} | {size} | {r["eager_ms"]:.1f} | {r["compiled_ms"]:.1f} | '
            f'{r["speedup"]:.2f}x | {r["first_call_s"]:.1f} | '
            f'{r["graphs"]} / {r["graph_breaks"]} | {r["max_rel_diff"]:.1e} |'
        )
    return '\n'.join(lines) + '\n'


def parse_size(text: str):
    """'S' -> (S, S); 'HxW' -> (H, W); multiples of :data:`MULTIPLE`."""
    return parse_hw(text, '--sizes', MULTIPLE)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        '--models',
        nargs='+',
        default=list(MODELS),
        metavar='MODEL',
        help=f'from {list(MODELS)} (default: all)',
    )
    p.add_argument('--sizes', nargs='+', default=DEFAULT_SIZES, metavar='S|HxW')
    p.add_argument(
        '--backend',
        default='inductor',
        help=f'torch.compile backend, one of {BACKENDS} (default inductor)',
    )
    p.add_argument('--mode', default='default', help=f'torch.compile mode, one of {MODES}')
    p.add_argument('--repeat', type=int, default=5, help='timed calls of each, alternating')
    p.add_argument(
        '--threads',
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's, i.e. OMP_NUM_THREADS)",
    )
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_compile'))
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise CLIError(f'--models: unknown {unknown}; choose from {list(MODELS)}')
    if args.backend not in BACKENDS:
        raise CLIError(f'--backend must be one of {BACKENDS}, got {args.backend!r}')
    if args.mode not in MODES:
        raise CLIError(f'--mode must be one of {MODES}, got {args.mode!r}')
    for opt in ('repeat', 'threads'):
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise CLIError(f'--{opt} must be a positive int, got {value}')
    args.sizes = [parse_size(s) for s in args.sizes]
    return args


@main_guard
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    env = dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        python=platform.python_version(),
        backend=args.backend,
        mode=args.mode,
        command='python tools/analysis/benchmark_compile.py ' + ' '.join(argv),
    )
    results = {}
    for hw in args.sizes:
        for name in args.models:
            t = time.perf_counter()
            key = f'{name}|{size_label(hw)}'
            try:
                r = measure(name, hw, args)
            except Exception as err:  # noqa: BLE001  (a backbone that fails to compile: a row)
                r = dict(error=f'{type(err).__name__}: {str(err).splitlines()[0][:150]}')
            results[key] = r
            print(
                f'[{size_label(hw)}] {MODELS[name][1]}: '
                + (
                    r.get('error')
                    or (
                        f'eager {r["eager_ms"]:.1f} ms, compiled {r["compiled_ms"]:.1f} ms '
                        f'({r["speedup"]:.2f}x), first call {r["first_call_s"]:.1f} s, '
                        f'{r["graphs"]} graph(s) / {r["graph_breaks"]} break(s), '
                        f'max rel diff {r["max_rel_diff"]:.1e}'
                    )
                )
                + f' [{time.perf_counter() - t:.0f} s]',
                flush=True,
            )
            text = table(results, args.backend, args.mode)
            write_atomic(
                osp.join(args.out_dir, 'results.json'),
                json.dumps(dict(environment=env, results=results), indent=1),
            )
            write_atomic(osp.join(args.out_dir, 'table.md'), text)
    print('\n' + text + f'\nwritten: {osp.join(args.out_dir, "table.md")}')
    return results


if __name__ == '__main__':
    main()
