"""``tools/infer_highres.py --dense-baseline``: the same config with the family's own
dense attention (PVT's spatial reduction, Swin's windows), run in a child
(:func:`mmcirc.benchmark.runner.run_isolated`) capped with ``RLIMIT_AS``; it reports
whether it ran or ran out of memory, and when."""

import os.path as osp
import re
import tempfile
import time
from typing import Optional

from mmcirc.benchmark.runner import GB, run_isolated
from mmcirc.utils.memory import MB


def dense_attention(cfg) -> str:
    """The dense attention kind of the config's backbone family (its
    ``original_attention``); ``ValueError`` for backbones that have
    none (the isotropic CA-DeiT / VECA, other libraries' backbones)."""
    from mmseg.registry import MODELS

    cls = MODELS.get(cfg.model.backbone.type)
    kind = getattr(cls, 'original_attention', None)
    if not kind:
        raise ValueError(
            f'--dense-baseline needs a pyramid backbone with a dense attention of its own '
            f'(CA-PVT: sra, CA-Swin: window), the config has {cfg.model.backbone.type!r}'
        )
    return kind


def run_dense_baseline(
    config: str,
    img,
    *,
    checkpoint: Optional[str] = None,
    cfg_options: Optional[dict] = None,
    stage_attentions: Optional[str] = None,
    mem_cap_gb: float = 20.0,
    device: str = 'cpu',
    timeout: float = 1800,
    upsample: str = 'banded',
) -> dict:
    """Run the dense-attention equivalent of ``config`` on ``img`` (H, W, 3 uint8) in a
    child capped at ``mem_cap_gb`` GiB (:func:`child`); a dict: status (``'ok'``, ``'oom'``,
    ``'timeout'``, ``'error'``), time_s, build_s, wall_s, error, failed_during,
    peak_rss_mb, mem_cap_gb, stage_attentions, attention estimates, input_size."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix='mmcirc_dense_', ignore_cleanup_errors=True) as tmpdir:
        image = osp.join(tmpdir, 'img.npy')
        np.save(image, img)
        spec = dict(
            config=osp.abspath(config),
            checkpoint=checkpoint,
            cfg_options=cfg_options or {},
            stage_attentions=stage_attentions,
            device=device,
            upsample=upsample,
            image=image,
        )
        result = run_isolated(
            'mmcirc.cli.infer_highres_dense:child', spec, timeout=timeout, mem_cap_gb=mem_cap_gb
        )
    result.pop('log_tail', None)
    result.update(mem_cap_gb=mem_cap_gb, input_size=list(img.shape[:2]))
    result.setdefault('time_s', None)
    result.setdefault('stage_attentions', None)
    return result


def child(spec: dict) -> dict:
    """The child's measurement (see :func:`run_dense_baseline`): builds, runs, and turns
    a failure into ``status`` 'oom' / 'error' with the phase it happened in."""
    import warnings

    import numpy as np

    from mmcirc.utils.memory import is_out_of_memory, peak_rss_bytes, rss_baseline

    out = dict(status='error', stage_attentions=None, build_s=None, time_s=None, error=None)
    t_start, t0 = time.perf_counter(), None
    try:
        warnings.simplefilter('ignore')
        from mmcirc import apis
        from mmcirc.analysis.attention_memory import (
            quadratic_attention_estimates,
            quadratic_warning,
        )

        img = np.load(spec['image'])
        cfg = apis.load_highres_config(spec['config'], spec['cfg_options'])
        dense = spec['stage_attentions'] or dense_attention(cfg)
        apis.apply_backbone_overrides(cfg, dict(stage_attentions=dense))
        model = apis.build_model(  # the dense attention layers are not the checkpoint's
            cfg, spec['checkpoint'], device=spec['device'], allow_partial_weights=True
        )
        out['stage_attentions'] = list(model.backbone.stage_attentions)
        out['build_s'] = round(time.perf_counter() - t_start, 2)
        hw = img.shape[:2]
        out['attention_estimates'] = quadratic_attention_estimates(model.backbone, hw)
        warn = quadratic_warning(model.backbone, hw)
        if warn:
            print(warn, flush=True)
        base, _ = rss_baseline()
        out['baseline_rss_mb'] = round(base / MB, 1)
        t0 = time.perf_counter()
        labels, times = apis.predict_labels(model, img, upsample=spec['upsample'])
        out.update(
            status='ok',
            time_s=round(times['time_s'], 3),
            labels_present=int(len(np.unique(labels))),
        )
    except Exception as err:  # noqa: BLE001  (report, whatever it is)
        if t0 is not None:
            out['time_s'] = round(time.perf_counter() - t0, 3)
        out['status'] = 'oom' if is_out_of_memory(err) else 'error'
        text = str(err).strip()
        out['error'] = f'{type(err).__name__}: {text.splitlines()[-1] if text else ""}'
        out['failed_during'] = 'inference' if t0 is not None else 'setup'
    out['peak_rss_mb'] = round(peak_rss_bytes() / MB, 1)
    if out.get('baseline_rss_mb') is not None:
        out['peak_increase_mb'] = round(out['peak_rss_mb'] - out['baseline_rss_mb'], 1)
    return out


def short_error(error: str) -> str:
    """torch's allocator message -> 'cannot allocate 64.0 GiB'; else the first 90 chars."""
    m = re.search(r'tried to allocate (\d+) bytes', error)
    if m:
        return f'cannot allocate {int(m.group(1)) / GB:.1f} GiB'
    return error[:90]
