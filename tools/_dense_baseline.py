"""The dense-attention baseline of ``tools/infer_highres.py``: the same config with
``stage_attentions`` = the family's own attention (mmdet's PVT-T with spatial-reduction
attention everywhere, Swin's windows) run in a child process whose address space is
capped with ``RLIMIT_AS``; it reports whether it ran or ran out of memory, and when.

:func:`run_dense_baseline` runs this file as the child (``python _dense_baseline.py
SPEC.json``); the child writes its result JSON atomically and exits 0 whatever happened
(the parent also reads a kill by a signal or a timeout). Import it as a sibling module.
"""

import json
import os
import os.path as osp
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from typing import List, Optional

import numpy as np

GB = 1024**3
MB = 1024**2
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))

__all__ = ['dense_attention', 'run_dense_baseline', 'short_error']


def dense_attention(cfg) -> str:
    """The dense attention kind of the config's backbone family (its
    ``original_attention``); :class:`~mmcirc.utils.cli.CLIError` for backbones that have
    none (the isotropic CA-DeiT / VECA, other libraries' backbones)."""
    from mmseg.registry import MODELS

    from mmcirc.utils.cli import CLIError

    cls = MODELS.get(cfg.model.backbone.type)
    kind = getattr(cls, 'original_attention', None)
    if not kind:
        raise CLIError(
            f'--dense-baseline needs a pyramid backbone with a dense attention of its own '
            f'(CA-PVT: sra, CA-Swin: window), the config has {cfg.model.backbone.type!r}'
        )
    return kind


def run_dense_baseline(
    config: str,
    img: np.ndarray,
    *,
    checkpoint: Optional[str] = None,
    cfg_options: Optional[dict] = None,
    stage_attentions: Optional[str] = None,
    mem_cap_gb: float = 20.0,
    device: str = 'cpu',
    timeout: float = 1800,
    upsample: str = 'banded',
) -> dict:
    """Run the dense-attention equivalent of ``config`` on ``img`` in a child process
    with ``RLIMIT_AS = mem_cap_gb`` GiB and report what happened.

    The child builds the same config with ``stage_attentions`` set to the family's own
    attention (``'sra'`` for PVT: mmdet's ``PVTEncoderLayer`` in every stage, i.e. the
    original PVT; ``'window'`` for Swin) and runs
    :func:`mmcirc.apis.highres.predict_labels`. Returns a dict: status (``'ok'``,
    ``'out_of_memory'``, ``'killed'``, ``'timeout'``, ``'error'``), time_s (inference, or
    until the failure), build_s, wall_s (whole child), error, peak_rss_mb, mem_cap_gb,
    stage_attentions, attention estimates, returncode.
    """
    from mmcirc.apis.highres import is_out_of_memory

    cap = int(mem_cap_gb * GB)
    tmpdir = tempfile.mkdtemp(prefix='mmcirc_dense_')
    spec = dict(
        config=osp.abspath(config),
        checkpoint=checkpoint,
        cfg_options=cfg_options or {},
        stage_attentions=stage_attentions,
        device=device,
        upsample=upsample,
        image=osp.join(tmpdir, 'img.npy'),
        result=osp.join(tmpdir, 'result.json'),
    )
    np.save(spec['image'], img)
    with open(osp.join(tmpdir, 'spec.json'), 'w') as f:
        json.dump(spec, f)
    log_path = osp.join(tmpdir, 'child.log')
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t0 = time.perf_counter()
    status, rc = None, None
    try:
        with open(log_path, 'wb') as log:
            proc = subprocess.Popen(
                [sys.executable, osp.abspath(__file__), osp.join(tmpdir, 'spec.json')],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=limit,
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
                status = 'timeout'
        wall = time.perf_counter() - t0
        result = {}
        if osp.isfile(spec['result']):
            with open(spec['result']) as f:
                result = json.load(f)
        with open(log_path, 'rb') as f:
            tail = f.read()[-3000:].decode('utf-8', 'replace')
        if status is None:
            status = result.get('status') or ('killed' if rc is not None and rc < 0 else 'error')
        if status in ('killed', 'error', 'timeout') and not result.get('error'):
            lines = [ln for ln in tail.strip().splitlines() if ln.strip()]
            result['error'] = (
                f'killed by signal {-rc}'
                if rc is not None and rc < 0
                else (lines[-1] if lines else f'exit code {rc}')
            )
            if status == 'error' and is_out_of_memory(Exception(result['error'])):
                status = 'out_of_memory'
        result.update(
            status=status,
            returncode=rc,
            wall_s=round(wall, 2),
            mem_cap_gb=mem_cap_gb,
            input_size=list(img.shape[:2]),
        )
        result.setdefault('time_s', None)
        return result
    finally:
        for name in os.listdir(tmpdir):
            os.remove(osp.join(tmpdir, name))
        os.rmdir(tmpdir)


def child_main(argv: Optional[List[str]] = None) -> None:
    """Entry of the dense-baseline child (see :func:`run_dense_baseline`)."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    out = dict(status='error', stage_attentions=None, build_s=None, time_s=None, error=None)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    out['rlimit_as_gb'] = None if soft == resource.RLIM_INFINITY else round(soft / GB, 2)
    t_start = time.perf_counter()
    t0 = None
    try:
        warnings.simplefilter('ignore')
        import torch  # noqa: F401

        from mmcirc import apis as hr
        from mmcirc.analysis.memory import quadratic_attention_estimates, quadratic_warning
        from mmcirc.utils.memory import peak_rss_bytes, reset_peak_rss, rss_bytes

        img = np.load(spec['image'])
        cfg = hr.load_highres_config(spec['config'], spec['cfg_options'])
        dense = spec['stage_attentions'] or dense_attention(cfg)
        hr.apply_backbone_overrides(cfg, dict(stage_attentions=dense))
        model = hr.build_model(cfg, spec['checkpoint'], device=spec['device'], warn_random=True)
        out['stage_attentions'] = list(model.backbone.stage_attentions)
        out['build_s'] = round(time.perf_counter() - t_start, 2)
        hw = img.shape[:2]
        out['attention_estimates'] = quadratic_attention_estimates(model.backbone, hw)
        warn = quadratic_warning(model.backbone, hw)
        if warn:
            print(warn, flush=True)
        base = rss_bytes() if reset_peak_rss() else peak_rss_bytes()
        out['baseline_rss_mb'] = round(base / MB, 1)
        t0 = time.perf_counter()
        labels, times = hr.predict_labels(model, img, upsample=spec['upsample'])
        out.update(
            status='ok',
            time_s=round(times['time_s'], 3),
            labels_present=int(len(np.unique(labels))),
        )
    except BaseException as err:  # noqa: BLE001  (report, whatever it is)
        from mmcirc.apis.highres import is_out_of_memory

        if t0 is not None:
            out['time_s'] = round(time.perf_counter() - t0, 3)
        out['status'] = 'out_of_memory' if is_out_of_memory(err) else 'error'
        out['error'] = (
            f'{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ""}'
        )
        out['failed_during'] = 'inference' if t0 is not None else 'setup'
    from mmcirc.utils.fileio import atomic_write
    from mmcirc.utils.memory import peak_rss_bytes

    out['peak_rss_mb'] = round(peak_rss_bytes() / MB, 1)
    if out.get('baseline_rss_mb') is not None:
        out['peak_increase_mb'] = round(out['peak_rss_mb'] - out['baseline_rss_mb'], 1)
    atomic_write(spec['result'], json.dumps(out))
    print(json.dumps(out), flush=True)


def short_error(error: str) -> str:
    """torch's allocator message -> 'cannot allocate 64.0 GiB'; else the first 90 chars."""
    m = re.search(r'tried to allocate (\d+) bytes', error)
    if m:
        return f'cannot allocate {int(m.group(1)) / GB:.1f} GiB'
    return error[:90]


if __name__ == '__main__':
    child_main()
