"""The measurement core: threads (:func:`pin_threads`), peak-memory meters
(:class:`PeakMeter`), the step of one model under the axes of a measurement
(:func:`make_step`) and the round-robin timing of the models a table compares
(:func:`round_robin`). Everything here needs torch only.
"""

import contextlib
import gc
import statistics
import time
from typing import Callable, Dict, Optional

__all__ = ['PRECISIONS', 'COMPILE_BACKENDS', 'COMPILE_MODES', 'PeakMeter', 'failure', 'finite',
           'make_step', 'pin_threads', 'precision_context', 'round_robin']  # fmt: skip

#: precision axis -> autocast dtype name (None: float32, no autocast)
PRECISIONS = {'fp32': None, 'bf16': 'bfloat16', 'fp16': 'float16'}
COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')
COMPILE_BACKENDS = ('inductor', 'aot_eager', 'eager')


def pin_threads(threads: Optional[int] = None) -> int:
    """Set torch's intra-op threads to ``threads`` (None / 0: leave torch's) and return
    the count in use (recorded with every result)."""
    import torch

    if threads:
        if int(threads) < 1:
            raise ValueError(f'threads must be a positive int or None, got {threads!r}')
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


class PeakMeter:
    """``with PeakMeter(device) as m: ...`` then ``m.peak_mb``: the peak memory of the
    block above the memory before it, in MiB. CPU: the kernel's RSS high-water mark
    (``mmcirc.utils.memory``; meaningful for the first large computation of a fresh
    process, hence the memory children), ``m.reset`` saying whether the kernel let the
    mark be lowered (else the peak includes what came before); CUDA: the allocator's
    ``max_memory_allocated``."""

    def __init__(self, device='cpu'):
        import torch

        self.cuda = torch.device(device).type == 'cuda'
        self.peak_mb, self.reset = None, True

    def __enter__(self):
        gc.collect()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            from mmcirc.utils.memory import rss_baseline

            self._base, self.reset = rss_baseline()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            from mmcirc.utils.memory import peak_rss_bytes

            peak = peak_rss_bytes()
        self.peak_mb = max(peak - self._base, 0) / 2**20
        return False


def finite(out) -> bool:
    """Whether every tensor in a model's output (tensor, tuple / list / dict of them) is
    finite."""
    import torch

    if torch.is_tensor(out):
        return bool(out.float().isfinite().all())
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return all(finite(o) for o in out)
    return True


def precision_context(device, precision: str, flash: bool = False):
    """The autocast of ``precision`` on ``device`` (none for fp32); ``flash``: SDPA pinned
    to the flash kernel on CUDA too."""
    import torch

    stack = contextlib.ExitStack()
    dtype = PRECISIONS[precision]
    if dtype is not None:
        stack.enter_context(torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype)))
        if flash and torch.device(device).type == 'cuda':
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel(SDPBackend.FLASH_ATTENTION))
    return stack


def make_step(
    model,
    call: Callable,
    x,
    *,
    device='cpu',
    precision: str = 'fp32',
    backward: bool = False,
    compile: Optional[dict] = None,
    flash: bool = False,
) -> Callable:
    """``step()`` runs ``call(x)`` once (``call`` wraps ``model``; forward only in eval
    mode under ``no_grad``, or forward + backward of the sum of the outputs), under the
    autocast of ``precision`` (``flash``: also pin SDPA to the flash kernel on CUDA),
    synchronised; returns the output. ``compile``: ``torch.compile`` keyword arguments
    (the first ``step()`` compiles; CUDA graphs of the inductor's ``reduce-overhead`` /
    ``max-autotune`` modes get their step marker)."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {tuple(PRECISIONS)}, got {precision!r}')
    sync = torch.cuda.synchronize if torch.device(device).type == 'cuda' else lambda: None
    fn, cudagraphs = call, False
    if compile is not None:
        mode = compile.get('mode')
        if mode is not None and mode not in COMPILE_MODES:
            raise ValueError(f'compile mode must be one of {COMPILE_MODES}, got {mode!r}')
        cudagraphs = (compile.get('backend', 'inductor') == 'inductor' and torch.device(device).type
                      == 'cuda' and mode in ('reduce-overhead', 'max-autotune'))  # fmt: skip
        fn = torch.compile(call, dynamic=False, **compile)
    model.eval()  # also for backward: no dropout, the same graph as the forward timings
    if backward:
        x.requires_grad_()

    def step():
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        if backward:
            with precision_context(device, precision, flash):
                out = fn(x)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            sum(o.float().sum() for o in outs).backward()
            model.zero_grad(set_to_none=True)
            x.grad = None
        else:
            with torch.no_grad(), precision_context(device, precision, flash):
                out = fn(x)
        sync()
        return out

    return step


def failure(err) -> dict:
    """A step's exception as a result: ``status`` 'oom' or 'error' and its ``error``."""
    from mmcirc.utils.memory import is_out_of_memory

    text = str(err).strip()
    msg = f'{type(err).__name__}: {text.splitlines()[0][:200] if text else ""}'
    if is_out_of_memory(err):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return dict(status='oom', error='out of memory')
    return dict(status='error', error=msg)


def round_robin(
    steps: Dict[str, Callable],
    *,
    repeat: int = 5,
    warmup: int = 1,
    budget_s: Optional[float] = None,
    min_runs: int = 1,
    single_run_above: Optional[float] = None,
    on_first: Optional[Callable] = None,
    record_errors: bool = False,
) -> Dict[str, dict]:
    """Time ``steps`` (name -> ``step()``) side by side: warm-up of each step, then rounds
    in which every step runs once in turn, so that a changing machine load hits all
    compared models alike. Times are medians.

    Each step's first call is timed (``first_ms``; ``on_first(name, out)`` sees its
    output), then ``warmup - 1`` more untimed calls; then up to ``repeat`` rounds. A step
    stops taking part once its timed runs add up to ``budget_s`` and it has ``min_runs``
    (``budget_s`` None: no budget). A step whose first call took longer than
    ``single_run_above`` seconds is not repeated: its first call is the measurement
    (``warmup_only``). Returns name -> ``time_ms`` (median), ``min_ms``, ``runs``,
    ``times_ms``, ``first_ms``, ``warmup_only``. ``record_errors``: a step whose first
    call raises is left out, its result is ``{'status': 'oom' | 'error', 'error': ...}``
    (else the exception propagates).
    """
    steps = dict(steps)
    if repeat < 1 or warmup < 1 or min_runs < 1:
        raise ValueError(
            f'repeat, warmup and min_runs must be >= 1, got {repeat}, {warmup}, {min_runs}'
        )
    first, times, spent, failed = {}, {}, {}, {}
    for name, step in list(steps.items()):
        t = time.perf_counter()
        try:
            out = step()
        except Exception as err:  # noqa: BLE001  (one model failing is its result)
            if not record_errors:
                raise
            failed[name] = failure(err)
            del steps[name]
            continue
        first[name] = time.perf_counter() - t
        if on_first is not None:
            on_first(name, out)
        del out
        times[name], spent[name] = [], 0.0
        if single_run_above is not None and first[name] > single_run_above:
            continue
        for _ in range(warmup - 1):
            step()
    active = [n for n in steps if single_run_above is None or first[n] <= single_run_above]
    for _ in range(repeat):
        for name in active:
            if budget_s is not None and spent[name] >= budget_s and len(times[name]) >= min_runs:
                continue
            t = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t)
            spent[name] += times[name][-1]
    out = dict(failed)
    for name in steps:
        ts = times[name] or [first[name]]
        out[name] = dict(
            time_ms=1e3 * statistics.median(ts), min_ms=1e3 * min(ts), runs=len(ts),
            times_ms=[round(1e3 * t, 3) for t in ts], first_ms=1e3 * first[name],
            warmup_only=not times[name],
        )  # fmt: skip
    return out
