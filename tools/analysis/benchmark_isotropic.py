"""The released isotropic models against the plain-attention ViTs of the same size,
side by side in one run: CA-DeiT vs DeiT, VECA vs ViT (backbone forward, CPU).

    python tools/analysis/benchmark_isotropic.py [--models ca_deit_s deit_s veca_b vit_b]
        [--sizes 224 512 1024 2048] [--repeat 5] [--single-run-above 20] [--depth N]
        [--threads N] [--no-flops] [--timeout 3600] [--out-dir DIR]

Models (random weights; nothing is downloaded):

* ``ca_deit_{t,s,b}``: mmcirc's registered :class:`~mmcirc.models.backbones.CADeiT`
  (the official CA-DeiT layout, ``CirculantAttention`` with d = 1);
* ``veca_{s,b}``: mmcirc's registered :class:`~mmcirc.models.backbones.VECAViT`
  (the official VECA architecture, all 64 cores: C' = 64);
* ``deit_{t,s,b}``, ``vit_{s,b}``: timm's ``deit_*_patch16_224`` /
  ``vit_*_patch16_224`` (class token, learned position embedding resampled to the
  input's grid with ``dynamic_img_size``, fused ``scaled_dot_product_attention``),
  ``pretrained=False``, no classifier (``num_classes=0``).

Each model is compared with its plain-attention twin of the same width and depth
(:data:`BASELINE`: CA-DeiT-S with DeiT-S, VECA-B with ViT-B...). Every (model, size)
is measured in a fresh child process, the circulant / core model just before its
baseline at each size, so that the two columns of a ratio are measured side by side:

* time: median of ``--repeat`` forwards after one warm-up (batch 1, float32,
  ``torch.no_grad``, eval mode); when the warm-up alone takes longer than
  ``--single-run-above`` seconds it is the reported time (one run, marked ``*``);
* memory: what the forward adds to the resident set: the kernel's RSS high-water
  mark over the first forward (``mmcirc.utils.memory``: ``reset_peak_rss`` just
  before it, ``peak_rss_bytes`` after) minus the RSS with the model and input built;
* FLOPs: multiply-adds counted by ``mmcirc.analysis.count_flops`` (mmengine's
  counter plus mmcirc's FFT / softmax / SDPA handles). The counter executes the model
  (tracing on meta tensors fails on the patch-embedding convolution), so to keep 2048
  px affordable it counts the same model with 1 and 2 blocks and extrapolates,
  ``F(depth) = F(1) + (depth - 1) (F(2) - F(1))``: exact for isotropic models, whose
  blocks are identical and keep the token count (checked against the full count in
  ``tests/tools/test_benchmark_tools.py``).

Results go to ``DIR/results.json`` and ``DIR/table.md`` (default
``work_dirs/benchmark_isotropic``), rewritten atomically after every measurement.
"""

import argparse
import contextlib
import datetime
import json
import os
import os.path as osp
import platform
import statistics
import sys
import time

from mmcirc.utils.cli import CLIError, main_guard, parse_hw
from mmcirc.utils.fileio import atomic_write as write_atomic

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

#: name -> (kind, arch or timm model name, label)
MODELS = {
    'ca_deit_t': ('cadeit', 'tiny', 'CA-DeiT-T'),
    'ca_deit_s': ('cadeit', 'small', 'CA-DeiT-S'),
    'ca_deit_b': ('cadeit', 'base', 'CA-DeiT-B'),
    'veca_s': ('veca', 'small', 'VECA-S'),
    'veca_b': ('veca', 'base', 'VECA-B'),
    'deit_t': ('timm', 'deit_tiny_patch16_224', 'DeiT-T'),
    'deit_s': ('timm', 'deit_small_patch16_224', 'DeiT-S'),
    'deit_b': ('timm', 'deit_base_patch16_224', 'DeiT-B'),
    'vit_s': ('timm', 'vit_small_patch16_224', 'ViT-S'),
    'vit_b': ('timm', 'vit_base_patch16_224', 'ViT-B'),
}
#: circulant / core model -> its plain-attention twin (same width and depth)
BASELINE = {
    'ca_deit_t': 'deit_t',
    'ca_deit_s': 'deit_s',
    'ca_deit_b': 'deit_b',
    'veca_s': 'vit_s',
    'veca_b': 'vit_b',
}
DEFAULT_MODELS = ['ca_deit_s', 'deit_s', 'veca_b', 'vit_b']
DEFAULT_SIZES = ['224', '512', '1024', '2048']
PATCH = 16


# ----------------------------------------------------------------------------- models
def _quiet_init():
    """Silence mmengine's per-parameter ``init_weights`` log (INFO) while building; a
    torch-only install has no such logger."""
    import importlib.util

    if importlib.util.find_spec('mmengine') is None:
        return contextlib.nullcontext()
    from mmcirc.utils.quiet import quiet_logger

    return quiet_logger()


def build(name: str, depth: int = None):
    """Model ``name`` of :data:`MODELS` (random weights, eval mode, CPU); ``depth``
    keeps that many blocks (None: the real depth, 12)."""
    import torch

    kind, arch, _ = MODELS[name]
    torch.manual_seed(0)
    if kind == 'timm':
        import timm

        extra = {} if depth is None else dict(depth=depth)
        model = timm.create_model(
            arch, pretrained=False, num_classes=0, img_size=224, dynamic_img_size=True, **extra
        )
    elif kind == 'cadeit':
        from mmcirc.models.backbones.ca_deit import CADeiT

        if depth is not None:
            arch = dict(CADeiT.arch_zoo[arch], depth=depth)
        model = CADeiT(arch)
        with _quiet_init():
            model.init_weights()
    else:
        from mmcirc.models.backbones.veca import VECAViT

        if depth is not None:
            arch = dict(VECAViT.arch_zoo[arch], num_layers=depth)
        model = VECAViT(arch)
        with _quiet_init():
            model.init_weights()
    return model.eval()


def model_depth(name: str) -> int:
    """Number of blocks of the real model (12 for every entry of :data:`MODELS`)."""
    model = build(name, depth=None)
    return len(model.blocks)


def count_gmacs(name: str, hw, depth: int = None) -> float:
    """Counted GMACs of one backbone forward at ``hw`` = (H, W), from the 1- and
    2-block models (see the module docstring); ``depth``: of the model counted
    (None: the real one)."""
    import torch

    from mmcirc.analysis import count_flops

    depth = depth or model_depth(name)
    img = torch.randn(1, 3, *hw)
    f1 = count_flops(build(name, depth=1), img)
    if depth == 1:
        return f1 / 1e9
    f2 = count_flops(build(name, depth=2), img)
    return (f1 + (depth - 1) * (f2 - f1)) / 1e9


# ----------------------------------------------------------------------------- worker
def worker(spec: dict) -> dict:
    """One measurement (in a forked child process): time, peak memory, FLOPs."""
    import gc

    import torch

    from mmcirc.utils.memory import peak_rss_bytes, reset_peak_rss, rss_bytes

    if spec.get('threads'):
        torch.set_num_threads(spec['threads'])
    name, hw = spec['name'], tuple(spec['hw'])
    model = build(name, spec.get('depth'))
    img = torch.randn(1, 3, *hw)
    res = dict(
        params_m=sum(p.numel() for p in model.parameters()) / 1e6, threads=torch.get_num_threads()
    )
    gc.collect()
    with torch.no_grad():
        base = rss_bytes()
        res['peak_reset'] = reset_peak_rss()  # False: the peak also holds the build's
        t = time.perf_counter()
        out = model(img)
        first = time.perf_counter() - t
        res['peak_mb'] = max(peak_rss_bytes() - base, 0) / 2**20
        outs = out if isinstance(out, (tuple, list)) else (out,)
        res['finite'] = all(bool(o.isfinite().all()) for o in outs if torch.is_tensor(o))
        del out, outs
        times = [first]
        if first <= spec['single_run_above']:
            times = []
            for _ in range(spec['repeat']):
                t = time.perf_counter()
                model(img)
                times.append(time.perf_counter() - t)
    res.update(
        time_ms=1e3 * statistics.median(times),
        runs=len(times),
        times_ms=[round(1e3 * x, 2) for x in times],
        first_ms=1e3 * first,
    )
    del model, img
    gc.collect()
    if spec['flops']:
        res.update(flops(name, hw, spec.get('depth')))
    return res


def flops(name: str, hw, depth=None) -> dict:
    """``{'gmacs': ...}``, or ``{'gmacs_error': ...}`` when the counter fails (the
    timing stands; ``--flops-only`` fills the count in later)."""
    try:
        return dict(gmacs=count_gmacs(name, hw, depth))
    except Exception as err:  # noqa: BLE001  (reported in the table, not fatal)
        return dict(gmacs_error=f'{type(err).__name__}: {str(err)[:200]}')


def _child(spec, conn):
    try:
        conn.send(worker(spec))
    except BaseException as err:  # noqa: BLE001  (MemoryError, RuntimeError ...)
        conn.send(dict(error=f'failed ({type(err).__name__}: {str(err)[:120]})'))
    finally:
        conn.close()


def measure(name: str, hw, args) -> dict:
    """Run :func:`worker` for (name, hw) in a forked child (fresh memory counters; the
    parent has imported torch, timm and mmcirc already, so a child starts at once)."""
    import multiprocessing

    spec = dict(
        name=name,
        hw=list(hw),
        depth=args.depth,
        repeat=args.repeat,
        single_run_above=args.single_run_above,
        flops=args.flops,
        threads=args.threads,
    )
    ctx = multiprocessing.get_context('fork')
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(spec, send), daemon=True)
    proc.start()
    send.close()
    try:
        if recv.poll(args.timeout):
            return recv.recv()
        return dict(error=f'timeout ({args.timeout:g} s)')
    except EOFError:  # the child died without a word (killed: out of memory)
        proc.join(10)
        return dict(error=f'failed (child exit status {proc.exitcode})')
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()


# ----------------------------------------------------------------------------- output
def size_label(hw) -> str:
    return f'{hw[0]}x{hw[1]}'


def table(results: dict, models, sizes) -> str:
    """Markdown table; ratios against each model's baseline when both were measured."""
    lines = [
        '| size | model | params (M) | GMACs | time (ms) | peak mem (MiB) | '
        'speed-up vs baseline | memory vs baseline |',
        '|---|---|---:|---:|---:|---:|---:|---:|',
    ]
    for hw in sizes:
        for name in models:
            r = results.get(f'{name}|{size_label(hw)}')
            if r is None:
                continue
            base = results.get(f'{BASELINE.get(name)}|{size_label(hw)}', {})
            if 'error' in r:
                lines.append(
                    f'| {size_label(hw)} | {MODELS[name][2]} | - | - | {r["error"]} | - | - | - |'
                )
                continue
            gmacs = f'{r["gmacs"]:.2f}' if 'gmacs' in r else '-'
            time_ms = (
                (f'{r["time_ms"]:.1f}' + ('*' if r['runs'] == 1 else '')) if 'time_ms' in r else '-'
            )
            speed = (
                f'{base["time_ms"] / r["time_ms"]:.2f}x'
                if 'time_ms' in base and 'time_ms' in r
                else '-'
            )
            mem = (
                f'{r["peak_mb"] / base["peak_mb"]:.2f}'
                if base.get('peak_mb', 0) > 0 and 'peak_mb' in r
                else '-'
            )
            params = f'{r["params_m"]:.2f}' if 'params_m' in r else '-'
            peak = f'{r["peak_mb"]:.0f}' if 'peak_mb' in r else '-'
            lines.append(
                f'| {size_label(hw)} | {MODELS[name][2]} | {params} | {gmacs} | '
                f'{time_ms} | {peak} | {speed} | {mem} |'
            )
    return '\n'.join(lines) + '\n'


def environment(argv) -> dict:
    """Date, machine, versions and the command, for the results file."""
    import torch

    try:
        import timm

        timm_version = timm.__version__
    except ImportError:
        timm_version = None
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        with open('/proc/cpuinfo') as f:
            cpu = next(
                (line.split(':', 1)[1].strip() for line in f if line.startswith('model name')), cpu
            )
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        cpu=cpu,
        cpu_count=os.cpu_count(),
        affinity=sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else None,
        torch=torch.__version__,
        timm=timm_version,
        python=platform.python_version(),
        command='python tools/analysis/benchmark_isotropic.py ' + ' '.join(argv),
    )


# ----------------------------------------------------------------------------- CLI
def parse_size(text: str):
    """'S' -> (S, S); 'HxW' -> (H, W); multiples of :data:`PATCH`."""
    return parse_hw(text, '--sizes', PATCH)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        '--models',
        nargs='+',
        default=DEFAULT_MODELS,
        metavar='MODEL',
        help=f'from {list(MODELS)} (default: {DEFAULT_MODELS})',
    )
    p.add_argument(
        '--sizes',
        nargs='+',
        default=DEFAULT_SIZES,
        metavar='S|HxW',
        help=f'input sizes (default: {DEFAULT_SIZES})',
    )
    p.add_argument('--repeat', type=int, default=5, help='timed forwards after the warm-up')
    p.add_argument(
        '--single-run-above',
        type=float,
        default=20.0,
        help='seconds: a slower warm-up is the reported time (one run)',
    )
    p.add_argument(
        '--depth',
        type=int,
        default=None,
        help='keep the first DEPTH blocks (smoke tests; default: all 12)',
    )
    p.add_argument(
        '--threads',
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's, i.e. OMP_NUM_THREADS)",
    )
    p.add_argument('--no-flops', dest='flops', action='store_false', help='skip FLOP counting')
    p.add_argument(
        '--flops-only',
        action='store_true',
        help='count FLOPs only (no timing) and add them to DIR/results.json',
    )
    p.add_argument('--timeout', type=float, default=3600.0, help='seconds per measurement')
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_isotropic'))
    args = p.parse_args(argv)
    if args.flops_only and not args.flops:
        raise CLIError('--flops-only and --no-flops exclude each other')
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise CLIError(f'--models: unknown {unknown}; choose from {list(MODELS)}')
    for opt in ('repeat', 'depth', 'threads'):
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise CLIError(f'--{opt} must be a positive int, got {value}')
    for opt in ('single_run_above', 'timeout'):
        if getattr(args, opt) <= 0:
            raise CLIError(f'--{opt.replace("_", "-")} must be > 0, got {getattr(args, opt)}')
    args.sizes = [parse_size(s) for s in args.sizes]
    return args


def order(models):
    """Models in measuring order: each circulant / core model right before its
    baseline (when both are asked for), the rest as given."""
    out = []
    for name in models:
        if name in out:
            continue
        out.append(name)
        if BASELINE.get(name) in models and BASELINE[name] not in out:
            out.append(BASELINE[name])
    return out


def _write(args, env, results):
    names, sizes = [], []
    for key in results:  # every measurement in the file, also those of earlier runs
        name, size = key.split('|')
        names += [name] if name not in names else []
        sizes += [size] if size not in sizes else []
    text = table(results, order(names), [parse_size(s) for s in sizes])
    write_atomic(
        osp.join(args.out_dir, 'results.json'),
        json.dumps(dict(environment=env, results=results), indent=1),
    )
    write_atomic(osp.join(args.out_dir, 'table.md'), text)
    return text


@main_guard
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    import importlib.util

    if (
        any(MODELS[m][0] == 'timm' for m in args.models)
        and importlib.util.find_spec('timm') is None
    ):
        raise CLIError('the DeiT / ViT baselines need timm: pip install timm')
    # import everything once here: the forked children start with it
    import timm  # noqa: F401
    import torch  # noqa: F401

    import mmcirc.analysis  # noqa: F401
    import mmcirc.models.backbones.ca_deit  # noqa: F401
    import mmcirc.models.backbones.veca  # noqa: F401

    models = order(args.models)
    env = environment(argv)
    results = {}
    json_path = osp.join(args.out_dir, 'results.json')
    if args.flops_only:
        if not osp.isfile(json_path):
            raise CLIError(
                f'--flops-only: no {json_path} to add the counts to (run the '
                'timing first, or drop --flops-only)'
            )
        with open(json_path) as f:
            saved = json.load(f)
        env, results = saved['environment'], saved['results']
        env['flops_command'] = environment(argv)['command']
    for hw in args.sizes:
        for name in models:
            key, t = f'{name}|{size_label(hw)}', time.perf_counter()
            if args.flops_only:
                r = results.setdefault(key, {})
                r.pop('gmacs_error', None)
                r.update(flops(name, hw, args.depth))
            else:
                r = results[key] = measure(name, hw, args)
            msg = r.get('error') or ', '.join(
                (
                    [
                        f'{r["time_ms"]:.1f} ms ({r["runs"]} run{"s" * (r["runs"] > 1)})',
                        f'{r["peak_mb"]:.0f} MiB',
                    ]
                    if 'time_ms' in r
                    else []
                )
                + ([f'{r["gmacs"]:.2f} GMACs'] if 'gmacs' in r else [])
                + ([f'FLOPs: {r["gmacs_error"]}'] if 'gmacs_error' in r else [])
                + ([] if r.get('finite', True) else ['NON-FINITE OUTPUT'])
            )
            print(
                f'[{size_label(hw)}] {MODELS[name][2]}: {msg} [{time.perf_counter() - t:.0f} s]',
                flush=True,
            )
            text = _write(args, env, results)
    print('\n' + text + f'\nwritten: {osp.join(args.out_dir, "table.md")}, {json_path}')
    return results


if __name__ == '__main__':
    main()
