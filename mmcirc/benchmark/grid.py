"""The one driver of the timing suites and the checks of their flags.

:func:`run_grid` walks a suite's cells (the points of its grid: sizes, precisions,
modes...) in order: **store** (the suite's :class:`~mmcirc.benchmark.report.ResultStore`,
merged with an earlier run of the same settings unless ``--fresh``) -> **measure** (the
suite's function of one cell: {key: result}) -> **record** (:func:`record`, one layout
for every suite) -> **save** (the store, atomically, after every cell) -> **table** (the
suite's markdown, written beside the store after every cell and printed at the end).

One record layout: ``status`` ('ok', 'oom', 'timeout', 'error', 'skipped') and, unless
'ok', ``error`` (one line); times in ms (``time_ms``, ``min_ms``, ``times_ms``,
``first_ms``, ``runs``, ``warmup_only``), memory in MiB (``peak_mb``), ``params`` and
``macs`` as counts; a suite's own figures beside them.

The checks raise one-line ``ValueError`` naming the flag (the command prints it as its
one ``error:`` line).
"""

import os.path as osp
import time
from typing import Callable, Dict, Iterable, Optional

from mmcirc.utils.fileio import atomic_write

from .report import ResultStore, environment

__all__ = ['at_least', 'known', 'parse_hw', 'positive', 'record', 'resolve_device', 'run_grid']

#: what a child's result carries about the process, not the measurement
_PROCESS_KEYS = ('returncode', 'wall_s', 'rlimit_as_gb', 'log_tail', 'results')


def record(result: dict) -> dict:
    """A measurement in the one layout (see the module docstring)."""
    rec = {k: v for k, v in result.items() if k not in _PROCESS_KEYS}
    rec.setdefault('status', 'ok')
    if rec['status'] != 'ok':
        rec['error'] = str(rec.get('error', ''))[:300]
    return rec


def describe(rec: dict) -> str:
    """One line of a record for the console."""
    if rec['status'] != 'ok':
        return f'{rec["status"]}: {rec.get("error", "")}'
    parts = [f'{rec["time_ms"]:.2f} ms ({rec["runs"]} runs)'] if 'time_ms' in rec else []
    parts += [f'{rec["peak_mb"]:.0f} MiB'] if rec.get('peak_mb') is not None else []
    parts += [f'{rec["macs"] / 1e9:.2f} GMACs'] if rec.get('macs') else []
    parts += [] if rec.get('finite', True) else ['NON-FINITE OUTPUT']
    return ', '.join(parts) or 'ok'


def run_grid(
    options,
    cells: Iterable,
    measure: Callable[[object, ResultStore], Dict[str, dict]],
    table: Callable[[ResultStore], str],
    *,
    name: str = 'results',
    settings: Optional[dict] = None,
    budget_s: Optional[float] = None,
    **env,
) -> ResultStore:
    """store -> measure -> record -> save -> table over ``cells`` (see the module
    docstring). Files: ``options.out_dir/<name>.json`` and its ``table`` markdown
    (``results_cpu`` -> ``table_cpu.md``). ``budget_s``: no cell starts after it (those
    cells are listed in the store's ``skipped``). ``env``: more of the environment."""
    store = ResultStore(osp.join(options.out_dir, f'{name}.json'))
    if not options.fresh:
        store.load(settings=settings)
    store.extra['settings'] = settings
    env = environment(options.command, device=getattr(options, 'device', None) or 'cpu', **env)
    table_path = osp.join(options.out_dir, name.replace('results', 'table') + '.md')
    skipped, start, text = [], time.perf_counter(), ''
    for cell in cells:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            skipped.append(str(cell))
            continue
        t = time.perf_counter()
        for key, result in measure(cell, store).items():
            rec = record(result)
            store.update({key: rec})
            print(f'{key}: {describe(rec)}', flush=True)
        print(f'[{cell}: {time.perf_counter() - t:.0f} s]', flush=True)
        store.save(environment=env, skipped=skipped)
        text = table(store)
        atomic_write(table_path, text + '\n')
    store.save(environment=env, skipped=skipped)
    if skipped:
        text += f'\n\nNot measured (time budget {budget_s:g} s): {", ".join(skipped)}'
        atomic_write(table_path, text + '\n')
    print(f'\n{text}\n\nwritten: {store.path}, {table_path}')
    return store


# ----------------------------------------------------------------------------- checks


def parse_hw(text: str, flag: str, multiple: int = 1):
    """A size flag's value, ``S`` (square) or ``HxW``, as (H, W): both >= ``multiple`` and
    multiples of it; anything else is a one-line ``ValueError`` naming ``flag``."""
    try:
        hw = tuple(int(p) for p in str(text).lower().split('x'))
    except ValueError:
        hw = ()
    if len(hw) == 1:
        hw = hw * 2
    if len(hw) != 2 or any(s < multiple or s % multiple for s in hw):
        raise ValueError(
            f'{flag}: each size must be S or HxW with multiples of {multiple} '
            f'(>= {multiple}), got {text!r}'
        )
    return hw


def at_least(options, names, least=1) -> None:
    """Each flag of ``names`` (dests) that is set is >= ``least`` (lists: each value)."""
    for name in names:
        value = getattr(options, name)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and v < least:
                raise ValueError(f'--{name.replace("_", "-")} must be >= {least}, got {v}')


def positive(options, names) -> None:
    """Each flag of ``names`` (dests) that is set is > 0."""
    for name in names:
        value = getattr(options, name)
        if value is not None and value <= 0:
            raise ValueError(f'--{name.replace("_", "-")} must be > 0, got {value}')


def known(values, allowed, flag) -> None:
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f'{flag}: unknown {unknown}; choose from {list(allowed)}')


def resolve_device(options) -> None:
    """``options.device``: None -> 'cuda' where torch sees one, else 'cpu'; 'cuda'
    without one is a one-line error."""
    import torch

    if options.device is None:
        options.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if options.device == 'cuda' and not torch.cuda.is_available():
        raise ValueError('--device cuda: CUDA is not available')
