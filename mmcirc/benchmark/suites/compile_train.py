"""Suite ``compile_train``: training iterations of the toy detection and segmentation
configs, eager against the compiled backbone and neck (``tools/train.py --compile``:
:class:`mmcirc.engine.compile.CompileBackboneHook`, the heads eager).

Jobs (:data:`JOBS`): ``det``, ``configs/toy/ca_pvt_t_retinanet_toy.py`` (every batch one
size); ``seg``, ``configs/toy/ca_pvt_t_fpn_toy_ade.py`` (random crops, one size);
``det_sizes``, the detection config with every batch after the first resized to a
random size, 96-192 px a side in steps of 32 (mmdet's ``BatchSyncRandomResize``). Per job
and step kind (``eager``, ``compiled``) one fresh process
(:func:`mmcirc.benchmark.runner.run_isolated`) builds mmengine's Runner from the config as
``tools/train.py`` does in one process (``Runner.from_cfg``), in ``--data-root`` (the
generated toy data, :mod:`mmcirc.datasets.toy_data`, made there when absent), with the
loader in the main process (``num_workers=0``), without validation or checkpoints, and
trains ``--iters`` iterations. Each ``train_step`` (data preprocessor, forward, backward,
optimizer step; not the loading) is timed; after each, the graphs torch.compile compiled
in it are counted (``torch._dynamo``'s ``unique_graphs``) and the backbone's input sizes
recorded. Each run has an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR``): the compile
of a first run.

Reported per job: seconds per iteration after ``--warmup`` iterations (median), compiled
over eager, the first iteration (the compile), dynamo's and its backend's compile time
(``torch._dynamo.utils.calculate_time_spent``), the graphs compiled in the first iteration
and after it (recompiles: target 0 at a fixed size, at most one per new size), the graph
breaks (``torch._dynamo``'s ``graph_break`` count; fullgraph=True makes a break an error)
and the loss of each iteration.

Writes ``--out`` (a JSON store, atomically after each run); the documentation's table
(:func:`table`) is rendered from ``docs/results/compile_train_cpu.json`` by
``python .dev_scripts/benchmark_docs.py --no-run --tables compile_train``.
"""

import os
import os.path as osp
import shutil
import statistics
import tempfile
import time

from ..grid import at_least, known, positive
from ..measurement import COMPILE_BACKENDS, pin_threads
from ..report import ResultStore, environment, figure, markdown_table, ratio

SHARED = dict(threads=None, timeout=1800)

#: job -> (label, config, the toy dataset it reads, BatchSyncRandomResize's range or None)
JOBS = {
    'det': ('RetinaNet CA-PVT-T', 'configs/toy/ca_pvt_t_retinanet_toy.py', 'coco', None),
    'seg': ('Semantic FPN CA-PVT-T', 'configs/toy/ca_pvt_t_fpn_toy_ade.py', 'ade', None),
    'det_sizes': ('RetinaNet CA-PVT-T, random sizes', 'configs/toy/ca_pvt_t_retinanet_toy.py',
                  'coco', (96, 192)),
}  # fmt: skip
STEPS = ('eager', 'compiled')
#: toy dataset -> its folder in --data-root/data
DATASETS = dict(coco='toy_coco', ade='toy_ade')


def train_run(spec: dict) -> dict:
    """One training run of ``spec`` (the isolated child's function): ``config``,
    ``step`` ('eager' / 'compiled'), ``backend``, ``iters``, ``work_dir``, ``threads``,
    ``size_range``; returns the per-iteration records and dynamo's totals."""
    import torch
    from torch._dynamo.utils import calculate_time_spent, counters

    from mmengine.runner import Runner

    from mmcirc.apis.builder import load_model_config
    from mmcirc.engine.compile import add_compile_hook, compiled_graphs

    threads = pin_threads(spec.get('threads'))
    iters = spec['iters']
    loader = dict(num_workers=0, persistent_workers=False)
    cfg = load_model_config(spec['config'], {
        'train_cfg.max_iters': iters, 'train_cfg.val_interval': iters + 1,
        'default_hooks.checkpoint.interval': iters + 1,
        'default_hooks.checkpoint.save_last': False, 'default_hooks.logger.interval': iters,
        'train_dataloader.num_workers': 0, 'train_dataloader.persistent_workers': False,
    })  # fmt: skip
    cfg.launcher, cfg.work_dir = 'none', spec['work_dir']
    if spec.get('size_range'):  # a new size of every batch after the first
        cfg.model.data_preprocessor.batch_augments = [dict(
            type='BatchSyncRandomResize', interval=1, size_divisor=32,
            random_size_range=tuple(spec['size_range']))]  # fmt: skip
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None  # training only
    if cfg.get('test_dataloader'):
        cfg.test_dataloader.update(loader)
    if spec['step'] == 'compiled':
        add_compile_hook(cfg, spec['backend'])
    runner = Runner.from_cfg(cfg)  # one process, as tools/train.py builds it
    model, sizes, iterations = runner.model, [], []
    model.backbone.register_forward_pre_hook(lambda m, args: sizes.append(list(args[0].shape)))
    train_step = model.train_step

    def timed(*args, **kwargs):
        graphs, n = compiled_graphs(), len(sizes)
        t = time.perf_counter()
        out = train_step(*args, **kwargs)
        loss = float(out['loss'].detach())  # on a GPU: waits for the step
        seconds = time.perf_counter() - t
        iterations.append(dict(s=seconds, graphs=compiled_graphs() - graphs, loss=loss,
                               input=sizes[n] if len(sizes) > n else None))  # fmt: skip
        return out

    model.train_step = timed
    runner.train()
    spent = calculate_time_spent()
    return dict(iterations=iterations, graph_breaks=sum(counters['graph_break'].values()),
                compile_s=spent.get('total_wall_time', 0.0), threads=threads,
                torch_threads=torch.get_num_threads())  # fmt: skip


def summary(run: dict, warmup: int) -> dict:
    """A run's figures: median seconds per iteration after ``warmup`` iterations, the
    first iteration, graphs in the first iteration and after it, the input sizes."""
    its = run['iterations']
    later = [r['s'] for r in its[warmup:]] or [its[-1]['s']]
    return dict(
        s_per_iter=statistics.median(later), first_s=its[0]['s'], graphs_first=its[0]['graphs'],
        recompiles=sum(r['graphs'] for r in its[1:]),
        sizes=sorted({tuple(r['input'][2:]) for r in its if r.get('input')}),
    )  # fmt: skip


def ensure_toy_data(root: str, jobs) -> str:
    """``root/data`` holding the toy datasets the ``jobs``' configs read (made where
    absent); returns ``root``."""
    from mmcirc.datasets.toy_data import make_toy_data

    needed = sorted({JOBS[job][2] for job in jobs})
    missing = [d for d in needed if not osp.isdir(osp.join(root, 'data', DATASETS[d]))]
    if missing:
        print(f'[compile_train] making the toy data ({", ".join(missing)}) in {root}/data')
        make_toy_data(missing, out_dir=osp.join(root, 'data'))
    return root


def table(store: dict) -> str:
    """One row per job: eager and compiled seconds per iteration after the warm-up, their
    ratio, the first iterations, the compile time, the graphs and recompiles, the breaks."""
    results, settings = store['results'], store['settings']
    rows = []
    for job in JOBS:
        e, c = results.get(f'{job}|eager'), results.get(f'{job}|compiled')
        if e is None and c is None:
            continue
        ok = all(r is not None and r.get('status', 'ok') == 'ok' for r in (e, c))
        sizes = ', '.join(f'{h}x{w}' for h, w in (c or e).get('sizes', []))
        rows.append([
            JOBS[job][0], sizes or '-', figure(e, 's_per_iter', '{:.2f}'),
            figure(c, 's_per_iter', '{:.2f}'),
            ratio(c['s_per_iter'], e['s_per_iter'], suffix='x') if ok else '-',
            f'{figure(e, "first_s")} / {figure(c, "first_s")}', figure(c, 'compile_s', '{:.0f}'),
            f'{figure(c, "graphs_first", "{}")} / {figure(c, "recompiles", "{}")}',
            figure(c, 'graph_breaks', '{}'),
        ])  # fmt: skip
    head = ['job', 'backbone input (HxW)', 'eager (s / iteration)', 'compiled (s / iteration)',
            'compiled / eager', 'first iteration, eager / compiled (s)', 'compile (s)',
            'graphs: first iteration / after it', 'graph breaks']  # fmt: skip
    return (
        markdown_table(head, rows, 'llrrrrrrr')
        + f'\n\n{settings["iters"]} training iterations per run, each in a fresh process; '
        f'seconds per iteration: the median of iterations {settings["warmup"] + 1}-'
        f'{settings["iters"]} (data loading not counted); compiled: the backbone and the '
        f'neck (`--compile`, backend {settings["backend"]!r}, fullgraph), the heads eager; '
        'compile: dynamo and its backend, forward and backward, with an empty inductor cache; '
        f'load after the runs: {store.get("load_after", float("nan")):.1f}.'
    )


def add_arguments(p):
    p.add_argument('--jobs', nargs='+', default=['det', 'seg'], metavar='JOB',
                   help=f'from {list(JOBS)} (default: det seg)')  # fmt: skip
    p.add_argument('--iters', type=int, default=20, help='training iterations per run (20)')
    p.add_argument('--warmup', type=int, default=2, help='iterations left out of the median (2)')
    p.add_argument('--backend', default='inductor', choices=COMPILE_BACKENDS)
    out = osp.join('work_dirs', 'benchmark_compile_train')
    p.add_argument('--data-root', default=out, help='its data/ holds the toy datasets')
    p.add_argument('--out', default=osp.join(out, 'results.json'), help='results file (JSON)')


def check(options):
    known(options.jobs, JOBS, '--jobs')
    at_least(options, ['iters', 'threads'])
    positive(options, ['timeout'])
    if not 0 <= options.warmup < options.iters:
        raise ValueError(f'--warmup must be in [0, --iters), got {options.warmup}')


def run(options):
    """Every job of ``options.jobs``, eager then compiled, each in an isolated child;
    the store written after each run (``options``: the flags, checked by :func:`check`)."""
    import torch

    from ..runner import REPO, run_isolated

    root = ensure_toy_data(osp.abspath(options.data_root), options.jobs)
    settings = dict(iters=options.iters, warmup=options.warmup, backend=options.backend,
                    threads=options.threads)  # fmt: skip
    device = 'cuda' if torch.cuda.is_available() else 'cpu'  # where mmengine's Runner trains
    env = environment(options.command, device=device, backend=options.backend)
    store = ResultStore(options.out).load(settings)
    for job in options.jobs:
        _, config, _, size_range = JOBS[job]
        for step in STEPS:
            t = time.perf_counter()
            spec = dict(
                config=osp.join(REPO, config), step=step, backend=options.backend,
                iters=options.iters, threads=options.threads, size_range=size_range,
                work_dir=osp.join(root, 'work_dirs', f'{job}_{step}'),
            )  # fmt: skip
            cache = tempfile.mkdtemp(prefix='inductor_cache_')  # a cold compile
            try:
                res = run_isolated('mmcirc.benchmark.suites.compile_train:train_run', spec,
                                   timeout=options.timeout, cwd=root,
                                   env=dict(TORCHINDUCTOR_CACHE_DIR=cache))  # fmt: skip
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            if res['status'] == 'ok':
                res.update(summary(res, options.warmup))
                msg = (
                    f'{res["s_per_iter"]:.2f} s / iteration, first {res["first_s"]:.1f} s, '
                    f'graphs {res["graphs_first"]} + {res["recompiles"]} recompiles, '
                    f'{res["graph_breaks"]} breaks, compile {res["compile_s"]:.0f} s'
                )
            else:
                msg = f'{res["status"]}: {res.get("error")}'
            store.update({f'{job}|{step}': res})
            store.save(environment=env, settings=settings, load_after=os.getloadavg()[0])
            print(f'[{job} {step}] {msg} [{time.perf_counter() - t:.0f} s]', flush=True)
    text = table(dict(store.extra, results=store.results))
    print('\n' + text + f'\n\nwritten: {options.out}')
    return store.results
