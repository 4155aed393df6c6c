"""The documentation's tables whose results file is kept in the repository
(``docs/results/*.json``): figures measured on machines the suite does not run on (the
GPU), or by a job rather than a benchmark suite (the main job on toy data), or counted by
``tools/analysis/get_flops.py`` (the model zoo, ``docs_metafiles.py``). Each is rendered
between its markers (``docs_tables.py``) in every document that holds them, so a figure
shown in two documents comes from one file (``python .dev_scripts/benchmark_docs.py
--tables gpu ...``;
``tests/docs`` checks that every document holds what its files render).

* :data:`STORED`: name -> :class:`StoredTable` (results file, renderer);
* :data:`DOCUMENTS`: the documents that hold stored tables;
* :func:`render_document`: a document with every stored table it holds re-rendered.
"""

import json
import os.path as osp
from dataclasses import dataclass
from typing import Callable, Dict, List

from docs_metafiles import ZOO_RESULTS, render_zoo
from docs_tables import block, marker, replace_blocks

from mmcirc.benchmark.report import markdown_table, ratio
from mmcirc.benchmark.suites import compile_train

__all__ = [
    'DOCUMENTS',
    'STORED',
    'StoredTable',
    'load',
    'render_document',
    'render_gpu',
    'render_gpu_headline',
    'render_toy',
    'render_toy_runs',
    'toy_runs',
]

#: documents that hold stored tables (paths relative to the repository root)
DOCUMENTS = ('README.md', 'docs/benchmarks.md', 'configs/README.md')


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- the GPU


def _gpu_machine(store: dict, part: dict, commit: bool = False) -> str:
    """The machine line of one part of the GPU results: its device and versions, its
    ``command`` (the exact command line) or, where none is known, its
    ``command_not_recorded`` (what is known instead), and the code it measured (with
    ``commit``: the commit it measured, for the record of docs/benchmarks.md)."""
    env = store['environment']
    ran = f'`{part["command"]}`' if part.get('command') else part['command_not_recorded']
    code = env['code'] + (f'; commit {env["commit"]}' if commit else '')
    return (
        f'GPU: {env["device"]}, torch {env["torch"]} + CUDA {env["cuda"]}, mmcv {env["mmcv"]}, '
        f'{env["date"]}; {ran}; {code}.'
    )


def _gpu_backbone_table(store: dict) -> str:
    part = store['backbones']
    rows = {r['model']: r for r in part['rows']}
    table = []
    for r in part['rows']:
        base = rows.get(r.get('baseline'))
        cells = [r['label']]
        for i, ms in enumerate(r['ms']):
            vs = ratio(base['ms'][i], ms, suffix='x') if base else '-'
            cells.append(f'{ms}' + ('' if vs == '-' else f' ({vs})'))
        table.append(cells)
    head = ['backbone, ms'] + part['columns']
    return markdown_table(head, table, 'l' + 'r' * len(part['columns']))


def render_gpu_headline(store: dict, commit: bool = False) -> str:
    """The README's GPU table: the backbones' times with the speed-up against the peer
    (``commit``: :func:`_gpu_machine`'s)."""
    part = store['backbones']
    return (
        _gpu_backbone_table(store)
        + f'\n\nGPU, {part["settings"]}; in brackets: against PVT-S (the PVT-S '
        'variants) or Swin-T (CA-Swin-T) in the same run, below 1x: slower than the peer.\n\n'
        + _gpu_machine(store, part, commit)
    )


def render_gpu(store: dict) -> str:
    """docs/benchmarks.md's GPU tables: the backbones, then CA-DeiT-T against DeiT-T."""
    iso = store['isotropic']
    rows = [
        [
            r['batch'],
            f'{r["size"]}x{r["size"]}',
            r['precision'],
            r['ca_deit_t_ms'],
            r['deit_t_ms'],
            ratio(r['deit_t_ms'], r['ca_deit_t_ms'], suffix='x'),
        ]
        for r in iso['rows']
    ]
    head = ['batch', 'input', 'precision', 'CA-DeiT-T (ms)', 'DeiT-T (ms)', 'speed-up']
    return (
        render_gpu_headline(store, commit=True)
        + '\n\n'
        + markdown_table(head, rows, 'rllrrr')
        + f'\n\n{iso["settings"]}. The official CA-DeiT-T code (its own model file, not '
        f"mmcirc's): {iso['official_ca_deit_t_224_fp32_ms']} ms at 224 px, fp32, batch 1.\n\n"
        + _gpu_machine(store, iso, commit=True)
    )


# ----------------------------------------------------------------------------- the main job


RUN_KEYS = ('date', 'machine', 'commit', 'torch', 'threads')


def toy_runs(store: dict, which: str = 'runs') -> List[dict]:
    """The main job's runs of ``which`` (``'runs'``: of code with the numerics it has,
    ``store['numerics']``; ``'earlier_runs'``: of code with other numerics), each checked
    to name its date, machine, commit, torch and threads."""
    runs = store.get(which, [])
    for i, run in enumerate(runs):
        missing = [k for k in RUN_KEYS if k not in run]
        if missing:
            raise ValueError(f'{which}[{i}] of the main job must name {", ".join(missing)}')
    return runs


def _spread(runs: List[dict], job: str, key: str) -> str:
    """``'lo-hi'`` of ``key`` over the runs that report it (the runs' own strings)."""
    values = sorted({r[job][key] for r in runs if key in r.get(job, {})}, key=float)
    return values[0] if len(values) == 1 else f'{values[0]}-{values[-1]}'


def render_toy(store: dict) -> str:
    """The README's main-job table: per job its data, schedule and the spread of its
    seed-0 result over the runs with the code's numerics (at least two CPU types); their
    commits are docs/benchmarks.md's."""
    runs, rows = toy_runs(store), []
    cpus = sorted({r['machine'] for r in runs})
    if len(cpus) < 2:
        raise ValueError(f'runs of the main job must cover at least 2 CPU types, got {cpus}')
    for key, job in store['jobs'].items():
        metric = f'**{job["metric"]} {_spread(runs, key, job["metric"])}**'
        also = ', '.join(f'{m} {_spread(runs, key, m)}' for m in job['also'])
        rows.append(
            [job['label'], job['data'], job['schedule'], f'{metric} ({also})', job['untrained']]
        )
    head = ['job', 'data', 'schedule', f'result, seed {store["seed"]}', 'untrained model']
    machines = '; '.join(f'{r["machine"]}, {r["date"]}' for r in runs)
    return (
        markdown_table(head, rows)
        + f'\n\nThe lowest and highest of {len(runs)} runs of `{store["command"]}` on '
        f'{len(cpus)} CPU types ({machines}), all with the numerics the code has: '
        f'{store["numerics"]["what"]}. Other CPUs and a change of the arithmetic may differ by '
        'about that spread; each run, its commit and figures: '
        '[docs/benchmarks.md](docs/benchmarks.md#the-main-job).'
    )


def render_toy_runs(store: dict) -> str:
    """docs/benchmarks.md's main-job table: every run, its machine, commit, torch and
    threads and its figures; the runs of earlier numerics last."""
    jobs = store['jobs']
    metrics = [(key, m) for key, job in jobs.items() for m in [job['metric'], *job['also']]]
    head = ['date', 'machine', 'commit', 'torch', 'threads (det/seg)'] + [m for _, m in metrics]
    rows = [
        [
            r['date'],
            r['machine'],
            r['commit'] + ('' if which == 'runs' else ' (earlier numerics)'),
            r['torch'],
            '/'.join(str(r['threads'][key]) for key in jobs),
        ]
        + [r[key].get(m, '-') for key, m in metrics]
        for which in ('runs', 'earlier_runs')
        for r in toy_runs(store, which)
    ]
    return (
        f'`{store["command"]}` (seed {store["seed"]}; detection: '
        f'`{jobs["det"]["config"]}`, segmentation: `{jobs["seg"]["config"]}`); the rows without '
        f'a mark have the numerics the code has ({store["numerics"]["what"]}), from commit '
        f'{store["numerics"]["commit"]} on\n\n'
        + markdown_table(head, rows, 'l' * 5 + 'r' * len(metrics))
    )


def render_compile_train(store: dict) -> str:
    """The compiled training step's block (its command, the table, its machine) of
    ``docs/results/compile_train_cpu.json``."""
    env = store['environment']
    return block(env['command'], compile_train.table(store), env)


# ----------------------------------------------------------------------------- the tables


@dataclass(frozen=True)
class StoredTable:
    """A table rendered by ``render`` from ``results`` (a path relative to the repository
    root), in every one of :data:`DOCUMENTS` that holds its markers."""

    name: str
    results: str
    render: Callable[[dict], str]


STORED: Dict[str, StoredTable] = {
    t.name: t
    for t in (
        StoredTable('gpu_headline', 'docs/results/gpu_h200.json', render_gpu_headline),
        StoredTable('gpu', 'docs/results/gpu_h200.json', render_gpu),
        StoredTable('toy', 'docs/results/toy_job.json', render_toy),
        StoredTable('toy_runs', 'docs/results/toy_job.json', render_toy_runs),
        StoredTable('zoo', ZOO_RESULTS, render_zoo),
        StoredTable('compile_train', 'docs/results/compile_train_cpu.json', render_compile_train),
    )
}


def held(text: str) -> List[str]:
    """The stored tables whose opening marker ``text`` holds."""
    return [name for name in STORED if marker(name) in text]


def render_document(text: str, root: str, names=None, where: str = 'document') -> str:
    """``text`` with each stored table it holds (of ``names``; default all) rendered
    from its results file under ``root``."""
    blocks = {
        name: STORED[name].render(load(osp.join(root, STORED[name].results)))
        for name in held(text)
        if names is None or name in names
    }
    return replace_blocks(text, blocks, where) if blocks else text
