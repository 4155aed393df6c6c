"""The README's main job over seeds and attentions: mean and spread of its metrics.

``tools/analysis/main_job_seeds.py``: for every (job, attention, seed) it runs exactly what
``tools/run_demo.sh`` runs (``tools/train.py`` then ``tools/test.py`` on the toy config) with
``--cfg-options randomness.seed=SEED model.backbone.attention=ATT``: ``circulant`` is
CA-PVT-T as shipped, ``sra`` puts PVT's own spatial-reduction attention in every stage
(plain PVT-T), ``core`` core attention in stages 1-2 (Core-PVT-T, C' = 64). The metric
is read from the JSON file tools/test.py writes (bbox mAP for det, mIoU for seg).
Finished runs are kept in ``OUT/results.json`` and skipped when the script runs again,
so a long sweep can be continued; ``OUT/table.md`` gets mean, sample standard
deviation, min and max per (job, attention).
Seeds are the outer loop, so a sweep stopped early covers every model at the same
seeds. Each record keeps ``OMP_NUM_THREADS`` (threads change float summation order):
run one sweep with one setting, e.g. ``OMP_NUM_THREADS=1 taskset -c 0 python ...`` to
leave the other core free.
"""

import argparse
import glob
import itertools
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time

from mmcirc.benchmark.report import markdown_table
from mmcirc.cli.common import Accumulate, check_output_dir, main_guard
from mmcirc.utils.fileio import atomic_write

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
JOBS = {
    'det': ('configs/toy/ca_pvt_t_retinanet_toy.py', 'coco/bbox_mAP', 'bbox mAP'),
    'seg': ('configs/toy/ca_pvt_t_fpn_toy_ade.py', 'mIoU', 'mIoU'),
}
ATTENTIONS = {
    'circulant': 'CA-PVT-T (circulant, stages 1-2)',
    'sra': 'PVT-T (SRA everywhere)',
    'core': "Core-PVT-T (core, stages 1-2, C'=64)",
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    for flag, values in (('--jobs', list(JOBS)), ('--attentions', list(ATTENTIONS))):
        parser.add_argument(flag, nargs='+', action=Accumulate, default=values, choices=values)
    parser.add_argument('--seeds', nargs='+', action=Accumulate, type=int, default=[0, 1, 2])
    parser.add_argument('--out-dir', default='work_dirs/main_job_seeds')
    return parser.parse_args(argv)


def _metric(test_dir, key):
    """The metric from the newest ``<timestamp>/<timestamp>.json`` tools/test.py wrote."""
    files = sorted(glob.glob(osp.join(test_dir, '*', '*.json')))
    if not files:
        raise RuntimeError(f'tools/test.py wrote no metrics JSON under {test_dir}')
    with open(files[-1]) as f:
        return float(json.load(f)[key])


def run_one(job, attention, seed, out_dir):
    config, key, _ = JOBS[job]
    work = osp.join(out_dir, f'{job}_{attention}_seed{seed}')
    opts = ['--cfg-options', f'randomness.seed={seed}', f'model.backbone.attention={attention}']
    t0 = time.time()

    def run(script, *argv):
        argv = [sys.executable, script, config, *argv, *opts]
        subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)

    run('tools/train.py', '--work-dir', work)
    with open(osp.join(work, 'last_checkpoint')) as f:
        ckpt = f.read().strip()
    run('tools/test.py', ckpt, '--work-dir', osp.join(work, 'test'))
    return dict(
        job=job,
        attention=attention,
        seed=seed,
        metric=key,
        value=_metric(osp.join(work, 'test'), key),
        minutes=(time.time() - t0) / 60,
        threads=os.environ.get('OMP_NUM_THREADS', 'default'),
    )


def table(records):
    rows = []
    for job, att in itertools.product(JOBS, ATTENTIONS):
        vals = [r['value'] for r in records if r['job'] == job and r['attention'] == att]
        if vals:
            std = statistics.stdev(vals) if len(vals) > 1 else float('nan')
            stats = (statistics.mean(vals), std, min(vals), max(vals))
            rows.append([JOBS[job][2], ATTENTIONS[att], len(vals), *(f'{v:.3f}' for v in stats)])
    return markdown_table(['job', 'model', 'seeds', 'mean', 'std', 'min', 'max'], rows) + '\n'


@main_guard
def main(argv=None):
    args = parse_args(argv)
    check_output_dir(args.out_dir, '--out-dir')
    out_dir = osp.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)

    results_file = osp.join(out_dir, 'results.json')
    records = json.load(open(results_file)) if osp.isfile(results_file) else []
    # seeds outermost: a sweep stopped early still has every model at the same seeds
    for seed, attention, job in itertools.product(args.seeds, args.attentions, args.jobs):
        if any((r['seed'], r['attention'], r['job']) == (seed, attention, job) for r in records):
            continue
        rec = run_one(job, attention, seed, out_dir)
        records.append(rec)
        print(
            f'{job} {attention} seed {seed}: {rec["metric"]} = {rec["value"]:.4f} '
            f'({rec["minutes"]:.1f} min)',
            flush=True,
        )
        atomic_write(results_file, json.dumps(records, indent=1))
        atomic_write(osp.join(out_dir, 'table.md'), table(records))
    print(table(records))
