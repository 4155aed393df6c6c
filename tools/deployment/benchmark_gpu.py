"""CA-DeiT-T against DeiT-T on the GPU: eager vs ``torch.compile``, bf16 and fp32,
batch 1 and 32, 224-4096 px, in one run with a time budget.

    python tools/deployment/benchmark_gpu.py [--device cuda|cpu] [--models deit_t ca_deit_t]
        [--sizes 224 512 1024 1536 2048 3072 4096] [--batches 1 32] [--precisions bf16 fp32]
        [--modes eager compile] [--compile-mode reduce-overhead] [--compile-backend inductor]
        [--compile-max-size 2048] [--repeat 10] [--depth 12] [--budget-s 480] [--out-dir DIR]

Models are those of ``tools/analysis/benchmark_cadeit.py`` (timm ``VisionTransformer``,
patch 16, width 192, 12 blocks; CA-DeiT: CPE + mmcirc ``CirculantAttention``, d = 1).
DeiT's attention is timm's fused ``scaled_dot_product_attention``; under bf16 it is
pinned to the flash kernel (``sdpa_kernel(FLASH_ATTENTION)``, on CUDA), in fp32 it uses
what SDPA picks (flash needs half precision). The circulant FFTs always run in fp32
(autocast is disabled around them, see ``mmcirc.ops.circulant``).

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
import os
import os.path as osp
import statistics
import sys
import tempfile
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MODELS = ('deit_t', 'ca_deit_t', 'deit_s', 'ca_deit_s')
LABELS = {
    'deit_t': 'DeiT-T',
    'ca_deit_t': 'CA-DeiT-T',
    'deit_s': 'DeiT-S',
    'ca_deit_s': 'CA-DeiT-S',
}


def _benchmark_cadeit():
    """tools/analysis/benchmark_cadeit.py as a module (its ``build``)."""
    path = osp.join(ROOT, 'tools', 'analysis', 'benchmark_cadeit.py')
    spec = importlib.util.spec_from_file_location('benchmark_cadeit', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default=None, help='cuda or cpu (default: cuda if present)')
    p.add_argument('--models', nargs='+', default=['deit_t', 'ca_deit_t'], choices=MODELS)
    p.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024, 1536, 2048, 3072, 4096])
    p.add_argument('--batches', nargs='+', type=int, default=[1, 32])
    p.add_argument('--precisions', nargs='+', default=['bf16', 'fp32'], choices=['bf16', 'fp32'])
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
            p.error(f'--{name.replace("_", "-")} must be > 0, got {getattr(args, name)}')
    if any(b < 1 for b in args.batches):
        p.error(f'--batches must be positive ints, got {args.batches}')
    if any(s < 16 or s % 16 for s in args.sizes):
        p.error(f'--sizes must be multiples of the patch size 16, got {args.sizes}')
    return args


def _write_atomic(path, text):
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.' + osp.basename(path) + '.', suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


class Runner:
    """Builds each model once per device and times one cell at a time."""

    def __init__(self, args):
        import torch

        self.torch, self.args = torch, args
        self.device = torch.device(args.device)
        self.bench = _benchmark_cadeit()
        self.models = {}

    def model(self, name):
        if name not in self.models:
            self.torch.manual_seed(0)
            model = self.bench.build(name)
            vit = getattr(model, 'vit', model)  # CA-DeiT wraps timm's ViT
            vit.blocks = vit.blocks[: self.args.depth]
            self.models[name] = model.to(self.device)
        return self.models[name]

    def _sync(self):
        if self.device.type == 'cuda':
            self.torch.cuda.synchronize()

    def _contexts(self, name, precision):
        torch = self.torch
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        if precision == 'bf16':
            stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
            if not name.startswith('ca_') and self.device.type == 'cuda':
                from torch.nn.attention import SDPBackend, sdpa_kernel

                stack.enter_context(sdpa_kernel(SDPBackend.FLASH_ATTENTION))
        return stack

    def cell(self, name, size, batch, precision, mode):
        """{'time_ms', 'compile_s', 'peak_mb', 'finite'} or {'error'} of one cell."""
        torch, args = self.torch, self.args
        model = self.model(name)
        img = torch.randn(batch, 3, size, size, device=self.device)
        fn = model
        res = {}
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
            res['finite'] = bool(out.float().isfinite().all())
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
        'bf16: autocast (DeiT on the flash SDPA kernel; circulant FFTs in fp32). '
        'Speed-up: the DeiT of the same width, same batch, precision and mode, over the CA-DeiT.',
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
                            results.get(key(name[3:], size, batch, precision, mode), {})
                            if name.startswith('ca_')
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


def main(argv=None):
    args = parse_args(argv)
    import torch

    if importlib.util.find_spec('timm') is None:
        sys.exit('benchmark_gpu.py needs timm: pip install timm')
    args.device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if args.device == 'cuda' and not torch.cuda.is_available():
        sys.exit('--device cuda: CUDA is not available')
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
        _write_atomic(
            osp.join(args.out_dir, f'results_{stem}.json'),
            json.dumps(
                dict(device=device_name, args=vars(args), results=results, skipped=skipped),
                indent=1,
            ),
        )
    text = table(results, args, device_name)
    if skipped:
        text += f'\nSkipped (time budget {args.budget_s:g} s): {", ".join(skipped)}\n'
    _write_atomic(
        osp.join(args.out_dir, f'results_{stem}.json'),
        json.dumps(
            dict(device=device_name, args=vars(args), results=results, skipped=skipped), indent=1
        ),
    )
    _write_atomic(osp.join(args.out_dir, f'table_{stem}.md'), text)
    print('\n' + text)
    return results


if __name__ == '__main__':
    main()
