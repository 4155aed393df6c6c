"""The benchmark tables of the documentation: which suite measures each, with which flags,
how each is rendered from its suite's store, and how a rendered table replaces the old
one in a markdown file (``python .dev_scripts/benchmark_docs.py``).

A table lives in its document between two marker lines::

    <!-- generated: NAME -->
    ...replaced on every run...
    <!-- end -->

and what goes between them is the command that measured it, the table, and the machine
block its store's :func:`~mmcirc.benchmark.report.environment` recorded. Everything
outside the markers is left as it is.

* :data:`TABLES`: name -> :class:`DocTable` (suite, flags, store file, renderer);
* :func:`render_backbones` / :func:`render_headline`: the ``model`` suite's store of the
  backbones as the docs' wide table and the README's short one; the other renderers read
  the stores of the ``model``, ``layer``, ``sharded`` (two tables) and ``launches`` suites;
* :func:`machine_block`, :func:`block`, :func:`check_markers`, :func:`replace_blocks`.
"""

import json
import os.path as osp
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from mmcirc.benchmark.measurement import PRECISIONS
from mmcirc.benchmark.report import markdown_table, ratio

__all__ = [
    'BACKBONE_MODELS',
    'BACKBONE_SIZES',
    'END_MARKER',
    'HEADLINE',
    'TABLES',
    'DocTable',
    'block',
    'check_markers',
    'load_store',
    'machine_block',
    'marker',
    'render_backbones',
    'render_headline',
    'replace_blocks',
]

END_MARKER = '<!-- end -->'
#: the name of the README's short table (rendered from the ``backbones`` store)
HEADLINE = 'headline'
BACKBONE_MODELS = ('pvt_s', 'circ_pvt_s', 'core_pvt_s', 'ca_pvt_s', 'swin_t', 'ca_swin_t')
BACKBONE_SIZES = (1024, 2048)


def marker(name: str) -> str:
    """The opening marker line of the table ``name``."""
    return f'<!-- generated: {name} -->'


def load_store(path: str) -> dict:
    """The JSON file of a suite's :class:`~mmcirc.benchmark.report.ResultStore`, with
    ``results`` as a dict (a list-layout store is keyed by position)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'no results file {path} (run the table without --no-run)')
    with open(path) as f:
        data = json.load(f)
    results = data.get('results', {})
    if isinstance(results, list):
        data['results'] = {str(i): r for i, r in enumerate(results)}
    return data


# ----------------------------------------------------------------------------- renderers


def _cases():
    from mmcirc.benchmark.cases import CASES

    return CASES


def model_records(store: dict) -> Dict[Tuple[str, int, str], dict]:
    """{(model, size label, mode): record} of the ``model`` suite's batch-1 float32 cells."""
    out = {}
    for key, r in store['results'].items():
        name, hw, batch, precision, mode = key.split('|')
        if batch == '1' and precision == 'fp32':
            out[name, hw, mode] = r
    return out


def _ok(r: Optional[dict]) -> bool:
    return r is not None and r.get('status', 'ok') == 'ok'


def _backbone_records(store: dict) -> Tuple[Dict[Tuple[str, int], dict], List[str], List[int]]:
    """{(model, size): record}, the models (in the harness's order) and the sizes."""
    cases = _cases()
    by = {}
    for (name, hw, mode), r in model_records(store).items():
        if mode == 'eager':
            by[name, int(hw.split('x')[0])] = dict(
                r, time_s=r.get('time_ms', 0) / 1e3, mem_mb=r.get('peak_mb'), flops=r.get('macs')
            )
    models = [m for m in cases if any(k[0] == m for k in by)]
    if not by:
        raise ValueError('the backbone store holds no results')
    return by, models, sorted({k[1] for k in by})


def _time(r: Optional[dict]) -> str:
    if r is None:
        return '-'
    if not _ok(r):
        return r['status']
    return f'{r["time_s"]:.2f}' + ('*' if r.get('warmup_only') else '')


def _num(r: Optional[dict], key: str, scale: float = 1.0, fmt: str = '{:.0f}') -> str:
    return fmt.format(r[key] / scale) if _ok(r) and r.get(key) is not None else '-'


def _vs(by, m, size, key) -> str:
    """``m``'s figure against its baseline's at ``size``: speed-up for time, a fraction
    for memory; '-' without a baseline or a measurement of both."""
    base = _cases()[m].baseline
    r, b = by.get((m, size)), by.get((base, size)) if base else None
    if not (_ok(r) and _ok(b)):
        return '-'
    if key == 'time_s':
        return ratio(b['time_s'], r['time_s'], suffix='x')
    return ratio(r['mem_mb'], b['mem_mb']) if b['mem_mb'] else '-'


FOOTNOTE = (
    'Forward, batch 1, float32, no grad, random weights; time: median of the timed runs '
    '(`*`: one run, the warm-up, too slow to repeat); memory: the peak resident memory '
    'the forward adds above the built model and input; GMACs: multiply-adds with the '
    'FFTs, softmax and SDPA counted; params without classifier. Ratios: against the '
    "model's plain-attention baseline (mmdet's PVT-S for the PVT-S variants, mmdet's "
    'Swin-T for CA-Swin-T) in the same run.'
)


def render_backbones(store: dict) -> str:
    """The docs' backbone table: per model its parameters, and per size its GMACs, time,
    peak memory and speed-up against the baseline; memory against the baseline at the
    largest size."""
    cases = _cases()
    by, models, sizes = _backbone_records(store)
    head = ['model', 'params (M)']
    for s in sizes:
        head += [f'GMACs {s}', f's {s}', f'MB {s}']
    head += [
        f'speed-up vs baseline {" / ".join(map(str, sizes))}',
        f'memory vs baseline {sizes[-1]}',
    ]
    rows = []
    for m in models:
        params = next((r['params'] for (n, _), r in by.items() if n == m and r.get('params')), None)
        row = [cases[m].label, '-' if params is None else f'{params / 1e6:.2f}']
        for s in sizes:
            r = by.get((m, s))
            row += [_num(r, 'flops', 1e9, '{:.1f}'), _time(r), _num(r, 'mem_mb')]
        speed = [_vs(by, m, s, 'time_s') for s in sizes]
        row += [
            '-' if set(speed) == {'-'} else ' / '.join(speed),
            _vs(by, m, sizes[-1], 'mem_mb'),
        ]
        rows.append(row)
    align = 'lr' + 'rrr' * len(sizes) + 'rr'
    return markdown_table(head, rows, align) + '\n\n' + FOOTNOTE


def render_headline(store: dict) -> str:
    """The README's short table from the same store: time per size with the speed-up in
    brackets, memory at the largest size with its fraction of the baseline's."""
    cases = _cases()
    by, models, sizes = _backbone_records(store)
    last = sizes[-1]
    span = ' / '.join(map(str, sizes))
    head = ['model', 'params (M)', f'GMACs {span}', f'time (s) {span}', f'peak memory {last} (MB)']
    rows = []
    for m in models:
        params = next((r['params'] for (n, _), r in by.items() if n == m and r.get('params')), None)
        times = []
        for s in sizes:
            vs = _vs(by, m, s, 'time_s')
            times.append(_time(by.get((m, s))) + ('' if vs == '-' else f' ({vs})'))
        mem_vs = _vs(by, m, last, 'mem_mb')
        rows.append(
            [
                cases[m].label,
                '-' if params is None else f'{params / 1e6:.1f}',
                ' / '.join(_num(by.get((m, s)), 'flops', 1e9, '{:.1f}') for s in sizes),
                ' / '.join(times),
                _num(by.get((m, last)), 'mem_mb') + ('' if mem_vs == '-' else f' ({mem_vs})'),
            ]
        )
    return markdown_table(head, rows, 'lrrrr') + (
        '\n\nCPU, forward, batch 1, float32; in brackets: against PVT-S (the PVT-S variants) '
        'or Swin-T (CA-Swin-T) in the same run.'
    )


def render_attention(store: dict) -> str:
    """One attention layer: per map size and mode the time (ms) of each method, then
    its peak memory (MiB)."""
    cases = _cases()
    results = store['results']
    keys = [k.split('|') for k in results]
    methods = [m for m in cases if any(k[0] == m for k in keys)]
    sizes = sorted({int(k[1]) for k in keys})
    modes = [m for m in ('fwd', 'fwd+bwd') if any(k[2] == m for k in keys)]

    def cell(r, key):
        if r is None:
            return '-'
        if r['status'] == 'skipped':
            return 'N^2 memory' if 'N^2' in r.get('error', '') else 'skipped'
        return f'{r[key]:.1f}' if _ok(r) and key in r else r.get('status', '-')

    out = []
    for key, unit in (('time_ms', 'ms'), ('peak_mb', 'MiB')):
        head = ['map', 'step'] + [f'{cases[m].label} ({unit})' for m in methods]
        rows = [
            [f'{s}x{s}', mode] + [cell(results.get(f'{m}|{s}|{mode}'), key) for m in methods]
            for s in sizes
            for mode in modes
        ]
        out.append(markdown_table(head, rows, 'll' + 'r' * len(methods)))
    settings = store.get('settings') or {}
    return (
        '\n\n'.join(out) + f'\n\nOne layer on a (1, H*W, 64) token map, '
        f'{PRECISIONS[settings.get("precision", "fp32")] or "float32"}, '
        f'{settings.get("threads")} thread(s); time: median of the '
        'round-robin runs; memory: the peak above the setup, one fresh process per entry.'
    )


#: the labels of the compile table
COMPILE_LABELS = {
    'ca_pvt_t': 'CA-PVT-T',
    'core_pvt_t': "Core-PVT-T (C'=64)",
    'ca_swin_t': 'CA-Swin-T',
    'ca_deit_t': 'CA-DeiT-T',
    'veca_s': "VECA-S (C'=64)",
}


def render_compile(store: dict) -> str:
    """Eager against compiled per backbone and size (the ``model`` suite's cells of both
    modes with ``--explain``)."""
    recs, rows = model_records(store), []
    for (name, hw, mode), e in recs.items():
        c = recs.get((name, hw, 'compile'))
        if mode != 'eager' or c is None:
            continue
        if not (_ok(e) and _ok(c)):
            bad = e if not _ok(e) else c
            error = bad.get('error') or bad['status']
            rows.append([COMPILE_LABELS[name], hw, error, '-', '-', '-', '-', '-'])
            continue
        rows.append(
            [
                COMPILE_LABELS[name],
                hw,
                f'{e["time_ms"]:.1f}',
                f'{c["time_ms"]:.1f}',
                f'{e["time_ms"] / c["time_ms"]:.2f}x',
                f'{c["first_ms"] / 1e3:.1f}',
                f'{c["graphs"]} / {c["graph_breaks"]}',
                f'{c["max_rel_diff"]:.1e}',
            ]
        )
    head = ['backbone', 'size', 'eager (ms)', 'compiled (ms)', 'speed-up', 'first call (s)',
            'graphs / breaks', 'max rel diff']  # fmt: skip
    env = store.get('environment', {})
    return (
        f'torch.compile backend={env.get("backend")!r}, mode={env.get("mode")!r}; batch 1, '
        'float32, no grad.\n\n' + markdown_table(head, rows, 'llrrrrrr')
    )


def render_isotropic(store: dict) -> str:
    """The isotropic models against their peers (the ``model`` suite's eager cells):
    params, GMACs, time, peak memory, ratios against the peer."""
    cases, recs = _cases(), model_records(store)
    names, sizes = [], []
    for name, hw, _ in recs:
        names += [name] if name not in names else []
        sizes += [hw] if hw not in sizes else []
    ordered = []
    for name in names:
        ordered += [n for n in (name, cases[name].baseline) if n in names and n not in ordered]
    rows = []
    for size in sizes:
        for name in ordered:
            r = recs.get((name, size, 'eager'))
            if r is None:
                continue
            if not _ok(r):
                error = f'{r["status"]} ({r.get("error", "")[:120]})'
                rows.append([size, cases[name].label, '-', '-', error, '-', '-', '-'])
                continue
            base = recs.get((cases[name].baseline, size, 'eager')) or {}
            base = base if _ok(base) else {}
            peak, bpeak = r.get('peak_mb'), base.get('peak_mb')
            rows.append(
                [
                    size,
                    cases[name].label,
                    f'{r["params"] / 1e6:.2f}',
                    f'{r["macs"] / 1e9:.2f}' if r.get('macs') else '-',
                    f'{r["time_ms"]:.1f}' + ('*' if r['runs'] == 1 else ''),
                    f'{peak:.0f}' if peak is not None else '-',
                    ratio(base.get('time_ms'), r.get('time_ms'), suffix='x'),
                    ratio(peak, bpeak) if bpeak and bpeak > 0 and peak is not None else '-',
                ]
            )
    head = ['size', 'model', 'params (M)', 'GMACs', 'time (ms)', 'peak mem (MiB)',
            'speed-up vs baseline', 'memory vs baseline']  # fmt: skip
    return markdown_table(head, rows, 'llrrrrrr')


def render_sharded(store: dict) -> str:
    from mmcirc.benchmark.suites.sharded import table

    return table(store['results']).rstrip('\n')


def render_mesh(store: dict) -> str:
    from mmcirc.benchmark.suites.sharded import mesh_table

    return mesh_table(store['results']).rstrip('\n')


def render_launches(store: dict) -> str:
    from mmcirc.benchmark.suites.launches import table

    settings = store['settings']
    return table(store['results'], settings['sizes'], settings['host_size']).rstrip('\n')


# ----------------------------------------------------------------------------- the tables


@dataclass(frozen=True)
class DocTable:
    """One generated table: ``suite`` measures it with ``argv`` (its flags, without
    ``--out-dir``) into ``results`` (a file of its out-dir), ``render`` turns that
    store into markdown."""

    name: str
    suite: str
    argv: Tuple[str, ...]
    results: str
    render: Callable[[dict], str]


_COMPILE_MODELS = tuple(COMPILE_LABELS)
_ISOTROPIC_MODELS = ('ca_deit_s', 'deit_s', 'veca_b', 'vit_b')
#: name -> table, in the order the command runs them
TABLES: Dict[str, DocTable] = {
    t.name: t
    for t in (
        DocTable(
            'backbones', 'model', ('--flops', '--fresh', '--device', 'cpu'),
            'results_cpu.json', render_backbones,
        ),
        DocTable(
            'attention', 'layer', ('--threads', '1', '--no-backward', '--fresh', '--device', 'cpu'),
            'results_cpu.json', render_attention,
        ),
        DocTable(
            'isotropic', 'model',
            ('--models', *_ISOTROPIC_MODELS, '--sizes', '224', '512', '1024', '2048',
             '--threads', '1', '--repeat', '3', '--single-run-above', '30', '--budget', '3600',
             '--timeout', '3600', '--flops', '--fresh', '--device', 'cpu'),
            'results_cpu.json', render_isotropic,
        ),
        DocTable(
            'compile', 'model',
            ('--models', *_COMPILE_MODELS, '--sizes', '224', '512', '--threads', '1',
             '--repeat', '5', '--warmup', '2', '--modes', 'eager', 'compile', '--explain',
             '--device', 'cpu'),
            'results_cpu.json', render_compile,
        ),
        DocTable(
            'sharded', 'sharded',
            ('configs/ca_pvt_t-allcirc_fpn_80k_ade20k.py',
             'configs/core_pvt_t-allcore_fpn_80k_ade20k.py', '--size', '2048'),
            'results.json', render_sharded,
        ),
        DocTable(
            'mesh', 'sharded',
            ('configs/ca_pvt_t-allcirc_fpn_80k_ade20k.py', '--size', '1024', '--nprocs', '4',
             '--train', '--shard-sizes', '1', '2', '--threads', '1'),
            'results.json', render_mesh,
        ),
        DocTable('launches', 'launches', ('--threads', '1'), 'results.json', render_launches),
    )
}  # fmt: skip


def backbone_argv(models: Sequence[str], sizes: Sequence[int]) -> Tuple[str, ...]:
    """The ``backbones`` table's flags for ``models`` at ``sizes``."""
    return ('--models', *models, '--sizes', *map(str, sizes)) + TABLES['backbones'].argv


# ----------------------------------------------------------------------------- the blocks


def machine_block(env: Optional[dict]) -> str:
    """The machine a store was measured on, as one line of the doc (from
    :func:`~mmcirc.benchmark.report.environment`)."""
    if not env:
        return 'Machine: not recorded.'
    bf16 = env.get('cpu_bf16')
    parts = [
        env.get('date', 'no date'),
        f'{env.get("cpu", "unknown CPU")} ({env.get("cpu_isa", "?")}; native bf16: '
        f'{", ".join(bf16) if bf16 else "none"})',
        f'{env.get("cpu_count", "?")} CPUs',
        f'torch threads: {env.get("threads", "?")}',
        f'load {env["load"]:.1f} before' if env.get('load') is not None else None,
        f'device {env["device"]}' if env.get('device') else None,
        f'torch {env.get("torch", "?")}',
        f'timm {env["timm"]}' if env.get('timm') else None,
        f'Python {env.get("python", "?")}',
    ]
    return 'Machine: ' + ', '.join(p for p in parts if p) + '.'


def block(command: str, table: str, env: Optional[dict]) -> str:
    """What goes between a table's markers: its command, the table, its machine."""
    return f'`{command}`\n\n{table}\n\n{machine_block(env)}'


_MARKER_RE = re.compile(r'^<!-- generated: (\S+) -->$', re.M)


def check_markers(text: str, names: Iterable[str], where: str) -> None:
    """ValueError (one line naming ``where`` and the marker) unless every one of
    ``names`` has exactly one opening marker line followed by an end marker line."""
    for name in names:
        start = [m for m in _MARKER_RE.finditer(text) if m.group(1) == name]
        if not start:
            raise ValueError(
                f'{where}: no marker line {marker(name)!r} (put it and {END_MARKER!r} '
                'on lines of their own where the table goes)'
            )
        if len(start) > 1:
            raise ValueError(f'{where}: marker {marker(name)!r} appears {len(start)} times')
        end = text.find('\n' + END_MARKER, start[0].end())
        following = _MARKER_RE.search(text, start[0].end())
        if end < 0 or (following is not None and following.start() < end):
            raise ValueError(f'{where}: marker {marker(name)!r} has no {END_MARKER!r} after it')


def replace_blocks(text: str, blocks: Dict[str, str], where: str = 'document') -> str:
    """``text`` with what lies between each ``blocks`` name's markers replaced by its
    block; the markers and everything outside them unchanged."""
    check_markers(text, blocks, where)
    for name, content in blocks.items():
        m = next(m for m in _MARKER_RE.finditer(text) if m.group(1) == name)
        end = text.find('\n' + END_MARKER, m.end())
        text = text[: m.end()] + '\n' + content.strip('\n') + text[end:]
    return text
