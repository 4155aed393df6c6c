"""CA-DeiT-T against DeiT-T on the GPU: eager vs ``torch.compile``, bf16 and fp32,
batch 1 and 32, 224-4096 px, in one run with a time budget.

    python tools/deployment/benchmark_gpu.py [--device cuda|cpu] [--models deit_t ca_deit_t]
        [--sizes 224 512 1024 1536 2048 3072 4096] [--batches 1 32] [--precisions bf16 fp32 fp16]
        [--modes eager compile] [--compile-mode reduce-overhead] [--compile-backend inductor]
        [--compile-max-size 2048] [--repeat 10] [--depth 12] [--budget-s 480] [--out-dir DIR]

Models are those of ``tools/analysis/benchmark_isotropic.py`` (its ``build``: random
weights, backbone forward, no classifier): ``ca_deit_*`` / ``veca_*`` are mmcirc's
:class:`~mmcirc.models.backbones.CADeiT` / ``VECAViT`` (CA-DeiT: CPE + ``CirculantAttention``,
d = 1), each compared with its plain-attention twin (``deit_*`` / ``vit_*``: timm's
``VisionTransformer``, patch 16, ``dynamic_img_size``). The baselines' attention is timm's
fused ``scaled_dot_product_attention``; under bf16 / fp16 it is pinned to the flash kernel
(``sdpa_kernel(FLASH_ATTENTION)``, on CUDA), in fp32 it uses what SDPA picks (flash needs
half precision). The circulant FFTs always run in fp32 (autocast is disabled around them,
see ``mmcirc.ops.circulant``). ``--modes eager --batches 1`` is the plain timing of
DeiT-T against CA-DeiT-T; FLOP counts are ``benchmark_isotropic.py``'s.

Needs torch and timm only: it runs from a copy of the repository (not installed) on a
machine without mmengine / mmdet / mmcv; errors are one line ``error: ...``, exit 1.

``compile``: ``torch.compile(model, mode=--compile-mode)`` (default ``reduce-overhead``:
CUDA graphs, which remove the per-kernel launch cost that puts a floor under small
inputs), one static graph per size (``automatic_dynamic_shapes`` off); the compile time
of the first call is reported separately. Timing: median of ``--repeat`` calls after
three warm-ups, synchronised; memory: peak allocated over one call (CUDA).

Order of the runs: batch 1 before 32, bf16 before fp32, sizes ascending, so that the
time budget (``--budget-s``) cuts the least important cells; skipped cells are listed.
Results are written (atomically) after every cell: ``results_<device>.json`` and
``table_<device>.md`` in ``--out-dir`` (default ``work_dirs/benchmark_gpu``). On the CPU
(``--device cpu``) the script runs the same code paths at small sizes (a syntax and
plumbing check; pick ``--compile-backend eager`` there, inductor's C++ build is slow).
"""

import argparse
import contextlib
import importlib.util
import json
import os.path as osp
import statistics
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if ROOT not in sys.path:  # a copy of the repository, not installed (the GPU machine)
    sys.path.insert(0, ROOT)

from mmcirc.utils.cli import CLIError, main_guard  # noqa: E402
from mmcirc.utils.fileio import atomic_write  # noqa: E402

PRECISIONS = ('bf16', 'fp32', 'fp16')


def _load_isotropic():
    """tools/analysis/benchmark_isotropic.py as a module: the models (``build``,
    ``MODELS``, ``BASELINE``) of both benchmarks."""
    path = osp.join(ROOT, 'tools', 'analysis', 'benchmark_isotropic.py')
    spec = importlib.util.spec_from_file_location('benchmark_isotropic', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ISOTROPIC = _load_isotropic()
MODELS = tuple(ISOTROPIC.MODELS)
BASELINE = ISOTROPIC.BASELINE  # circulant / core model -> its plain-attention twin
LABELS = {name: label for name, (_, _, label) in ISOTROPIC.MODELS.items()}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default=None, help='cuda or cpu (default: cuda if present)')
    p.add_argument('--models', nargs='+', default=['deit_t', 'ca_deit_t'], choices=MODELS)
    p.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024, 1536, 2048, 3072, 4096])
    p.add_argument('--batches', nargs='+', type=int, default=[1, 32])
    p.add_argument('--precisions', nargs='+', default=['bf16', 'fp32'], choices=PRECISIONS)
    p.add_argument('--modes', nargs='+', default=['eager', 'compile'], choices=['eager', 'compile'])
    p.add_argument(
        '--compile-mode',
        default='reduce-overhead',
        choices=['default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'],
    )
    p.add_argument(
        '--compile-backend',
        default='inductor',
        help="torch.compile backend (inductor; 'eager'/'aot_eager' only trace)",
    )
    p.add_argument(
        '--compile-max-size',
        type=int,
        default=2048,
        help='compile only up to this size (the launch floor matters at small sizes)',
    )
    p.add_argument('--repeat', type=int, default=10, help='timed calls per cell')
    p.add_argument(
        '--depth',
        type=int,
        default=12,
        help='keep the first DEPTH blocks (12: the real models; less: smoke tests)',
    )
    p.add_argument(
        '--budget-s',
        type=float,
        default=480.0,
        help='stop starting new cells after this many seconds',
    )
    p.add_argument('--out-dir', default=osp.join(ROOT, 'work_dirs', 'benchmark_gpu'))
    args = p.parse_args(argv)
    for name in ('repeat', 'budget_s', 'compile_max_size', 'depth'):
        if getattr(args, name) <= 0:
            raise CLIError(f'--{name.replace("_", "-")} must be > 0, got {getattr(args, name)}')
    if any(b < 1 for b in args.batches):
        raise CLIError(f'--batches must be positive ints, got {args.batches}')
    if any(s < ISOTROPIC.PATCH or s % ISOTROPIC.PATCH for s in args.sizes):
        raise CLIError(
            f'--sizes must be multiples of the patch size {ISOTROPIC.PATCH}, got {args.sizes}'
        )
    return args


class Runner:
    """Builds each model once per device and times one cell at a time."""

    def __init__(self, args):
        import torch

        self.torch, self.args = torch, args
        self.device = torch.device(args.device)
        self.models = {}

    def model(self, name):
        if name not in self.models:
            depth = self.args.depth if self.args.depth < 12 else None  # all 12 blocks
            self.models[name] = ISOTROPIC.build(name, depth=depth).to(self.device)
        return self.models[name]

    def _sync(self):
        if self.device.type == 'cuda':
            self.torch.cuda.synchronize()

    def _contexts(self, name, precision):
        torch = self.torch
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        if precision != 'fp32':
            dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}[precision]
            stack.enter_context(torch.autocast(self.device.type, dtype=dtype))
            if name not in BASELINE and self.device.type == 'cuda':  # a plain-attention twin
                from torch.nn.attention import SDPBackend, sdpa_kernel

                stack.enter_context(sdpa_kernel(SDPBackend.FLASH_ATTENTION))
        return stack

    def cell(self, name, size, batch, precision, mode):
        """{'time_ms', 'first_call_s', 'peak_mb', 'finite', 'params'} or {'error'} of one
        cell."""
        torch, args = self.torch, self.args
        model = self.model(name)
        img = torch.randn(batch, 3, size, size, device=self.device)
        fn = model
        res = {'params': sum(p.numel() for p in model.parameters())}
        cudagraphs = (
            mode == 'compile'
            and args.compile_backend == 'inductor'
            and args.compile_mode in ('reduce-overhead', 'max-autotune')
            and self.device.type == 'cuda'
        )
        if mode == 'compile':
            torch._dynamo.reset()
            kwargs = dict(backend=args.compile_backend, dynamic=False)
            if args.compile_backend == 'inductor':
                kwargs['mode'] = args.compile_mode
            fn = torch.compile(model, **kwargs)

        def call():
            if cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            with self._contexts(name, precision):
                out = fn(img)
            self._sync()
            return out

        try:
            t = time.perf_counter()
            out = call()  # compiles in compile mode
            res['first_call_s'] = time.perf_counter() - t
            outs = out if isinstance(out, (tuple, list)) else (out,)  # mmcirc: a tuple
            res['finite'] = all(bool(o.float().isfinite().all()) for o in outs)
            del out, outs
            for _ in range(2):
                call()
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            res['time_ms'] = 1e3 * statistics.median(times)
            if self.device.type == 'cuda':
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                call()
                res['peak_mb'] = (torch.cuda.max_memory_allocated() - base) / 2**20
        except torch.OutOfMemoryError:
            res = {'error': 'out of memory'}
        except Exception as err:  # noqa: BLE001  (a failed cell is a result, not the end)
            res = {
                'error': f'{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ""}'
            }
        del img, fn
        if self.device.type == 'cuda':
            torch.cuda.empty_cache()
        return res


def _cells(args):
    for batch in args.batches:
        for precision in args.precisions:
            for size in args.sizes:
                for name in args.models:
                    for mode in args.modes:
                        if mode == 'compile' and size > args.compile_max_size:
                            continue
                        yield name, size, batch, precision, mode


def key(name, size, batch, precision, mode):
    return f'{name}|{size}|{batch}|{precision}|{mode}'


def table(results, args, device_name):
    lines = [
        f'Device: {device_name}. Forward, no grad, median of {args.repeat} calls. '
        f'compile: torch.compile(backend={args.compile_backend!r}'
        + (f', mode={args.compile_mode!r}). ' if args.compile_backend == 'inductor' else '). ')
        + f'{args.depth} blocks. '
        'bf16 / fp16: autocast (the baselines on the flash SDPA kernel; circulant FFTs in '
        'fp32). Speed-up: the time of the plain-attention twin (DeiT for CA-DeiT, ViT for '
        "VECA; same width, batch, precision and mode) over the model's.",
        '',
        '| batch | precision | size | model | eager (ms) | compiled (ms) | compile (s) | '
        'peak MiB | speed-up eager | speed-up compiled |',
        '|---:|---|---:|---|---:|---:|---:|---:|---:|---:|',
    ]

    def ms(r):
        return r['time_ms'] if 'time_ms' in r else None

    for batch in args.batches:
        for precision in args.precisions:
            for size in args.sizes:
                for name in args.models:
                    e = results.get(key(name, size, batch, precision, 'eager'), {})
                    c = results.get(key(name, size, batch, precision, 'compile'), {})
                    if not e and not c:
                        continue
                    speed = []
                    for mode, r in (('eager', e), ('compile', c)):
                        base = (
                            results.get(key(BASELINE[name], size, batch, precision, mode), {})
                            if name in BASELINE
                            else {}
                        )
                        speed.append(f'{ms(base) / ms(r):.2f}x' if ms(base) and ms(r) else '-')

                    def cell(r):
                        return r.get('error') or (f'{r["time_ms"]:.2f}' if 'time_ms' in r else '-')

                    peak = e.get('peak_mb', c.get('peak_mb'))
                    compile_s = f'{c["first_call_s"]:.1f}' if 'time_ms' in c else '-'
                    peak = '-' if peak is None else f'{peak:.0f}'
                    lines.append(
                        f'| {batch} | {precision} | {size} | {LABELS[name]} | {cell(e)} | '
                        f'{cell(c)} | {compile_s} | {peak} | {speed[0]} | {speed[1]} |'
                    )
    return '\n'.join(lines) + '\n'


@main_guard
def main(argv=None):
    args = parse_args(argv)
    import torch

    if importlib.util.find_spec('timm') is None:
        raise CLIError('benchmark_gpu.py needs timm (the DeiT / ViT baselines): pip install timm')
    args.device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if args.device not in ('cuda', 'cpu'):
        raise CLIError(f'--device must be cuda or cpu, got {args.device!r}')
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise CLIError('--device cuda: CUDA is not available')
    torch._dynamo.config.automatic_dynamic_shapes = False  # one static graph per size
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    device_name = (
        f'cuda ({torch.cuda.get_device_name()}, torch {torch.__version__})'
        if args.device == 'cuda'
        else f'cpu ({torch.get_num_threads()} threads, torch {torch.__version__})'
    )
    runner = Runner(args)
    results, skipped = {}, []
    start = time.perf_counter()
    stem = args.device
    for cell in _cells(args):
        if time.perf_counter() - start > args.budget_s:
            skipped.append(key(*cell))
            continue
        r = results[key(*cell)] = runner.cell(*cell)
        name, size, batch, precision, mode = cell
        print(
            f'[{batch} x {size}, {precision}, {mode}] {LABELS[name]}: '
            + (
                r.get('error')
                or (
                    f'{r["time_ms"]:.2f} ms (first call {r["first_call_s"]:.1f} s'
                    + (f', {r["peak_mb"]:.0f} MiB' if 'peak_mb' in r else '')
                    + ')'
                    + ('' if r['finite'] else ', NON-FINITE OUTPUT')
                )
            ),
            flush=True,
        )
        atomic_write(
            osp.join(args.out_dir, f'results_{stem}.json'),
            json.dumps(
                dict(device=device_name, args=vars(args), results=results, skipped=skipped),
                indent=1,
            ),
        )
    text = table(results, args, device_name)
    if skipped:
        text += f'\nSkipped (time budget {args.budget_s:g} s): {", ".join(skipped)}\n'
    atomic_write(
        osp.join(args.out_dir, f'results_{stem}.json'),
        json.dumps(
            dict(device=device_name, args=vars(args), results=results, skipped=skipped), indent=1
        ),
    )
    atomic_write(osp.join(args.out_dir, f'table_{stem}.md'), text)
    print('\n' + text)
    return results


if __name__ == '__main__':
    main()
