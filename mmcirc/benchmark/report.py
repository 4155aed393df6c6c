"""The report writer: the environment of a run (:func:`environment`), the JSON store that
merges runs (:class:`ResultStore`) and markdown tables with ratios against a named
baseline (:func:`ratio`, :func:`speedup`, :func:`figure`, :func:`markdown_table`).
"""

import contextlib
import datetime
import json
import os
import os.path as osp
import platform
import sys
from typing import Dict, List, Optional, Sequence

from mmcirc.utils.fileio import atomic_write

__all__ = ['ResultStore', 'device_name', 'environment', 'figure', 'markdown_table', 'ratio',
           'speedup']  # fmt: skip


def device_name(device: str) -> str:
    """``'cuda (NVIDIA H200, torch 2.x)'``; on the CPU ``'cpu'``."""
    import torch

    if str(device).startswith('cuda') and torch.cuda.is_available():
        return f'cuda ({torch.cuda.get_device_name()}, torch {torch.__version__})'
    return str(device)


def _cpuinfo(*keys: str) -> Optional[str]:
    """The value of the first /proc/cpuinfo line of one of ``keys``; None without one."""
    with contextlib.suppress(OSError, StopIteration):
        with open('/proc/cpuinfo') as f:
            return next(ln.split(':', 1)[1] for ln in f if ln.split(':', 1)[0].strip() in keys)
    return None


#: /proc/cpuinfo flags of native bfloat16 arithmetic (x86: AVX512_BF16 dot products,
#: AMX tiles; arm64: BF16); without one, oneDNN has no bf16 GEMM / convolution kernel
BF16_CPU_FLAGS = ('avx512_bf16', 'amx_bf16', 'bf16')


def environment(command: Optional[str] = None, device: str = 'cpu', **extra) -> dict:
    """Date (UTC), CPU, its vector ISA as torch sees it and its native bfloat16 flags
    (none: bf16 autocast runs emulated on the CPU, slower than float32), cores and
    affinity, load, torch / timm / Python versions, the device's name, threads and the
    command of a run (``command`` None: this process's ``sys.argv``)."""
    import torch

    try:
        import timm

        timm_version = timm.__version__
    except ImportError:
        timm_version = None
    if command is None:
        command = 'python ' + ' '.join(sys.argv)
    flags = _cpuinfo('flags', 'Features')  # native bf16: BF16_CPU_FLAGS
    env = dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        cpu=(_cpuinfo('model name') or platform.processor()).strip(),
        cpu_isa=torch.backends.cpu.get_cpu_capability(),
        cpu_bf16=None if flags is None else [f for f in BF16_CPU_FLAGS if f in flags.split()],
        cpu_count=os.cpu_count(),
        affinity=sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else None,
        load=os.getloadavg()[0] if hasattr(os, 'getloadavg') else None,
        torch=torch.__version__, timm=timm_version, python=platform.python_version(),
        device=device_name(device), threads=torch.get_num_threads(), command=command,
    )  # fmt: skip
    return dict(env, **extra)


class ResultStore:
    """The JSON file of a benchmark: ``{'environment': ..., 'results': {key: record},
    **extra}``, written whole and atomically by :meth:`save` (after every measurement: a
    kill leaves the last complete file)."""

    def __init__(self, path: str):
        self.path = path
        self.results: Dict[str, dict] = {}
        self.extra: dict = {}

    def load(self, settings: Optional[dict] = None) -> 'ResultStore':
        """Read the records of an earlier run, if the file exists (merge, not replace).
        ``settings`` (JSON-able): merge only a file saved with equal ``settings`` (the same
        device, precision, threads...: figures of one table); another file's records are
        replaced at the next save. Returns self."""
        self.extra['settings'] = settings
        if not osp.isfile(self.path):
            return self
        with open(self.path) as f:
            data = json.load(f)
        if settings is not None and data.get('settings') != json.loads(json.dumps(settings)):
            return self
        self.results = dict(data.pop('results', {}), **self.results)
        for k, v in data.items():
            self.extra.setdefault(k, v)
        return self

    def update(self, records: Dict[str, dict]) -> 'ResultStore':
        self.results.update(records)
        return self

    def save(self, **extra) -> str:
        """Write the file atomically (``extra``: top-level entries such as
        ``environment``, replacing those of earlier runs); returns its path."""
        self.extra.update(extra)
        atomic_write(self.path, json.dumps(dict(self.extra, results=self.results), indent=1))
        return self.path


def ratio(num, den, fmt: str = '{:.2f}', suffix: str = '') -> str:
    """``num / den`` formatted, ``'-'`` where either is missing or the denominator is 0."""
    if num is None or den is None or not den:
        return '-'
    return fmt.format(num / den) + suffix


def speedup(baseline: Optional[dict], record: Optional[dict], key: str = 'time_ms') -> str:
    """The baseline's time over the record's (``'1.23x'``), ``'-'`` where either has none."""
    get = lambda r: None if not r or r.get('status', 'ok') != 'ok' else r.get(key)  # noqa: E731
    return ratio(get(baseline), get(record), suffix='x')


def figure(rec: Optional[dict], key: str, fmt: str = '{:.1f}') -> str:
    """A record's figure in a table: ``fmt`` of ``rec[key]``, its status where it failed,
    ``'-'`` without a record or that figure."""
    if rec is None:
        return '-'
    if rec.get('status', 'ok') != 'ok':
        return rec['status']
    return fmt.format(rec[key]) if rec.get(key) is not None else '-'


def markdown_table(head: Sequence[str], rows: List[Sequence], align: Optional[str] = None) -> str:
    """A markdown table; ``align``: one character per column, ``'l'`` or ``'r'``."""
    align = align or 'l' * len(head)
    sep = '|' + ''.join('---:|' if a == 'r' else '---|' for a in align)
    lines = ['| ' + ' | '.join(head) + ' |', sep]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)
