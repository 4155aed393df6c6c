"""Measurements of registered cases, as functions of a JSON spec (what an isolated child
runs) and :func:`measure`, which runs them in children and joins their results.

Spec keys (all but ``case`` / ``cases`` optional): ``hw`` [H, W], ``batch`` (1),
``depth`` (None: the real model), ``device`` ('cpu'), ``precision`` ('fp32'),
``backward`` (False), ``compile`` (``torch.compile`` keyword arguments or None),
``threads`` (None: torch's), ``repeat`` (5), ``warmup`` (1), ``budget_s``,
``min_runs`` (1), ``single_run_above``, ``cuda_memory`` (True), ``flops`` (count the
multiply-adds: the isotropic models' extrapolated from 1 and 2 blocks), ``dim`` (the
channels of a token case, 64), ``explain`` (with ``compile``: ``torch._dynamo.explain``'s
graphs and breaks, and the largest difference of the compiled output from eager,
``max_rel_diff``: max |compiled - eager| / max |eager| over the outputs).
"""

import time
from typing import Dict, List, Optional

from .cases import case, count_macs
from .measurement import PeakMeter, failure, finite, make_step, pin_threads, round_robin

__all__ = ['measure', 'measure_group', 'measure_memory']


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _explain(call, x) -> dict:
    """Graphs and breaks of ``call(x)`` under dynamo, and the eager output."""
    import torch

    torch._dynamo.reset()
    with torch.no_grad():
        explain = torch._dynamo.explain(call)(x)
        eager = call(x)
    torch._dynamo.reset()
    reasons = [str(r.reason)[:200] for r in explain.break_reasons]
    return dict(graphs=explain.graph_count, graph_breaks=explain.graph_break_count,
                break_reasons=reasons, eager=eager)  # fmt: skip


def max_rel_diff(out, ref) -> float:
    """max over outputs of max|out - ref| / max|ref|."""
    worst = 0.0
    for o, r in zip(_outputs(out), _outputs(ref)):
        scale = float(r.abs().max()) or 1.0
        worst = max(worst, float((o.float() - r.float()).abs().max()) / scale)
    return worst


def _step(name, spec):
    c = case(name)
    model, call, x = c.build(
        spec['hw'], spec.get('batch', 1), spec.get('depth'), spec.get('device', 'cpu'),
        spec.get('dim', 64),
    )  # fmt: skip
    info = dict(params=sum(p.numel() for p in model.parameters()))
    if spec.get('explain') and spec.get('compile'):
        model.eval()
        info.update(_explain(call, x))
    step = make_step(
        model, call, x, device=spec.get('device', 'cpu'), precision=spec.get('precision', 'fp32'),
        backward=spec.get('backward', False), compile=spec.get('compile'), flash=c.flash,
    )  # fmt: skip
    return step, info


def _dtype(out):
    """The dtype of a model's first output tensor (``'torch.bfloat16'``...), or None."""
    while isinstance(out, (tuple, list, dict)) and out:
        out = next(iter(out.values())) if isinstance(out, dict) else out[0]
    return str(out.dtype) if hasattr(out, 'dtype') else None


def measure_memory(spec: dict) -> dict:
    """Peak memory of one call of ``spec['case']`` above the memory after building it
    (run in a fresh process: the CPU high-water mark is this call's alone); also its
    time (``first_ms``) and whether its output is finite."""
    threads = pin_threads(spec.get('threads'))
    t = time.perf_counter()
    step, res = _step(spec['case'], spec)
    res['build_s'] = time.perf_counter() - t
    with PeakMeter(spec.get('device', 'cpu')) as meter:
        t = time.perf_counter()
        out = step()
        res['first_ms'] = 1e3 * (time.perf_counter() - t)
    res.update(peak_mb=meter.peak_mb, peak_reset=meter.reset, finite=finite(out), threads=threads)
    res['dtype'] = _dtype(out)
    return res


def measure_group(spec: dict) -> dict:
    """Round-robin timing of ``spec['cases']`` in one process (see
    :func:`mmcirc.benchmark.measurement.round_robin`); on CUDA also each case's peak memory
    over one more call; FLOPs with ``spec['flops']``. Returns ``{'results': {name:
    record}}``, a record with ``status`` 'ok' or the failure of that case."""
    threads = pin_threads(spec.get('threads'))
    device = spec.get('device', 'cpu')
    steps, extra = {}, {}
    for name in spec['cases']:
        steps[name], extra[name] = _step(name, spec)

    def on_first(name, out):
        extra[name].update(finite=finite(out), dtype=_dtype(out))
        if 'eager' in extra[name]:
            eager = extra[name].pop('eager')
            extra[name]['max_rel_diff'] = max_rel_diff(out, eager)
            extra[name]['shapes'] = [list(o.shape) for o in _outputs(out)]

    res = round_robin(
        steps, repeat=spec.get('repeat', 5), warmup=spec.get('warmup', 1),
        budget_s=spec.get('budget_s'), min_runs=spec.get('min_runs', 1),
        single_run_above=spec.get('single_run_above'), on_first=on_first, record_errors=True,
    )  # fmt: skip
    for name, r in res.items():
        extra[name].pop('eager', None)  # a case that failed before its first output
        r.update(extra[name], threads=threads)
        r.setdefault('status', 'ok')
        if r['status'] == 'ok' and device != 'cpu' and spec.get('cuda_memory', True):
            with PeakMeter(device) as meter:
                steps[name]()
            r['peak_mb'] = meter.peak_mb
    del steps
    if spec.get('flops'):
        for name, r in res.items():
            if r['status'] != 'ok':
                continue
            try:
                extrapolate = case(name).group == 'isotropic'
                r['macs'] = count_macs(name, spec['hw'], spec.get('depth'), extrapolate)
            except Exception as err:  # noqa: BLE001  (the timing stands)
                r['flops_error'] = f'{type(err).__name__}: {str(err)[:200]}'
    return dict(results=res)


def measure(
    names: List[str],
    spec: dict,
    *,
    timeout: Optional[float] = None,
    mem_cap_gb: Optional[float] = None,
    memory_children: Optional[bool] = None,
    in_process: bool = False,
) -> Dict[str, dict]:
    """Measure the cases ``names`` side by side under ``spec`` in isolated children:
    on the CPU (``memory_children``, default: when the device is the CPU) one child per
    case reads its peak memory first (:func:`measure_memory`), then one child times the
    cases that ran there (:func:`measure_group`); a case whose memory call was slower
    than ``single_run_above`` keeps that call as its time (one run). A failed child is
    the result of its cases: ``status`` 'oom', 'timeout' or 'error' with ``error``.
    ``timeout``: seconds per memory child, times the number of cases for the timing
    child. ``in_process``: :func:`measure_group` in this process (no child, no CPU
    memory; on a GPU the cells of a grid without a new process each)."""
    from .runner import run_isolated

    if in_process:
        import torch

        torch._dynamo.reset()  # a compiled cell: its own graphs, not the last cell's cache
        try:
            return measure_group(dict(spec, cases=list(names)))['results']
        except Exception as err:  # noqa: BLE001  (a cell that fails to build is its result)
            return {name: failure(err) for name in names}

    if memory_children is None:
        memory_children = spec.get('device', 'cpu') == 'cpu'
    out, timed, slow = {}, list(names), spec.get('single_run_above')
    for name in names if memory_children else ():
        out[name] = m = run_isolated(
            'mmcirc.benchmark.tasks:measure_memory', dict(spec, case=name), timeout=timeout,
            mem_cap_gb=mem_cap_gb,
        )  # fmt: skip
        if m['status'] != 'ok' or (slow is not None and m['first_ms'] > 1e3 * slow):
            timed.remove(name)
        if m['status'] == 'ok' and name not in timed:  # one run: its memory call
            t = m['first_ms']
            m.update(time_ms=t, min_ms=t, runs=1, times_ms=[t], warmup_only=True)
    if timed:
        g = run_isolated('mmcirc.benchmark.tasks:measure_group', dict(spec, cases=timed),
                         timeout=None if timeout is None else timeout * len(timed),
                         mem_cap_gb=mem_cap_gb)  # fmt: skip
        for name in timed:
            r = g['results'][name] if g['status'] == 'ok' else dict(g)
            r.pop('results', None)
            if memory_children:
                r.update({k: out[name][k] for k in ('peak_mb', 'peak_reset', 'build_s')})
                r['memory_first_ms'] = out[name]['first_ms']
            out[name] = r
    return {name: out[name] for name in names}
