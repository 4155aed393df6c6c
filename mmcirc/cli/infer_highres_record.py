"""One image of ``tools/infer_highres.py`` predicted and measured (:func:`run_image`: a
:class:`HighResResult`, one schema for one process and a sharded run) and written
(:func:`write_result`, under :func:`output_stem`'s name). Memory figures are the
process's peak resident set size (:mod:`mmcirc.utils.memory`)."""

import json
import os.path as osp
from dataclasses import dataclass, field, fields
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mmcirc.analysis.attention_memory import quadratic_warning
from mmcirc.apis.builder import has_random_weights
from mmcirc.apis.decode import image_backbone
from mmcirc.apis.highres import Progress, predict_labels
from mmcirc.apis.overrides import backbone_summary
from mmcirc.utils.fileio import atomic_write_many
from mmcirc.utils.memory import MB, peak_rss_bytes, rss_baseline


def _only(run: str, default=None):
    """A field of the records of one kind of run (``'single'``, ``'sharded'``)."""
    return field(default=default, metadata=dict(run=run))


@dataclass
class HighResResult:
    """One image's record, the JSON ``tools/infer_highres.py`` writes beside its PNGs
    (:func:`write_result`), of one process (:func:`run_image`) or of a sharded run
    (``sharded``: every rank's figures, :mod:`mmcirc.distributed.segmentor`). The record holds the
    common fields and those of its run: ``forward_s`` to ``dense_baseline`` are one
    process's, ``world_size`` to ``per_rank`` a sharded run's (its ``time_s`` and
    peaks: the slowest / largest rank's)."""

    image: str
    input_size: List[int]
    source_size: List[int]
    config: str
    checkpoint: Optional[str]
    random_weights: bool
    overrides: dict
    backbone: dict
    device: str
    time_s: float
    peak_rss_mb: float
    peak_increase_mb: float
    torch_threads: int
    num_classes: int
    labels_present: int
    outputs: dict = field(default_factory=dict)
    forward_s: Optional[float] = _only('single')
    upsample: Optional[str] = _only('single')
    baseline_rss_mb: Optional[float] = _only('single')
    peak_is_per_image: Optional[bool] = _only('single')
    test_cfg: dict = field(default_factory=lambda: dict(mode='whole'), metadata=dict(run='single'))
    upsample_s: Optional[float] = _only('single')
    cuda_max_allocated_mb: Optional[float] = _only('single')
    quadratic_warning: Optional[str] = _only('single')
    dense_baseline: Optional[dict] = _only('single')
    sharded: bool = _only('sharded', False)
    world_size: Optional[int] = _only('sharded')
    bytes_sent: Optional[int] = _only('sharded')
    per_rank: Optional[list] = _only('sharded')

    def to_dict(self) -> dict:
        """The JSON record: the common fields and those of this record's run."""
        run = 'sharded' if self.sharded else 'single'
        return {
            f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get('run', run) == run
        }


def output_stem(out_dir: str, name: str, hw: Sequence[int], config: str, overrides: dict) -> str:
    """The path of one image's files without their endings:
    ``<out_dir>/<name>_<H>x<W>_<config name>[_<overrides>]`` (``_sa-<kinds>``,
    ``_nc<C'>``, ``_<boundary>``, ``_scale-<scale>``, in that order)."""
    parts = []
    if 'stage_attentions' in overrides:
        sa = overrides['stage_attentions']
        parts.append('sa-' + (sa if isinstance(sa, str) else '-'.join(sa)))
    if 'num_cores' in overrides:
        parts.append(f'nc{overrides["num_cores"]}')
    if 'boundary' in overrides:
        parts.append(overrides['boundary'])
    if 'scale' in overrides:
        parts.append(f'scale-{overrides["scale"]}')
    cfg_name = osp.splitext(osp.basename(config))[0]
    suffix = ''.join('_' + p for p in parts)
    return osp.join(out_dir, f'{name}_{hw[0]}x{hw[1]}_{cfg_name}{suffix}')


def write_result(
    stem: str, rec: HighResResult, img: np.ndarray, labels: np.ndarray, palette, opacity=0.5
) -> None:
    """Write one image's files at once (atomically, the JSON last): ``<stem>_labels.png``
    (the class ids, uint8, uint16 above 256 classes), ``<stem>_mask.png`` (coloured with
    ``palette``), ``<stem>_overlay.png`` (the mask blended over ``img`` at ``opacity``)
    and ``<stem>.json`` (``rec``, its ``outputs`` set to those file names)."""
    from mmcirc.cli import image_io as imio

    color = imio.colorize(labels, palette)
    files = {
        f'{stem}_labels.png': imio.encode_png(
            labels.astype('uint8' if len(palette) <= 256 else 'uint16')
        ),
        f'{stem}_mask.png': imio.encode_png(color[..., ::-1]),
        f'{stem}_overlay.png': imio.encode_png(imio.overlay(img, color, opacity)),
    }
    rec.outputs = {
        k: osp.basename(p)
        for k, p in zip(('labels', 'mask', 'overlay', 'json'), [*files, f'{stem}.json'])
    }
    files[f'{stem}.json'] = json.dumps(rec.to_dict(), indent=2).encode()
    atomic_write_many(files)  # in order: the JSON last


def run_image(
    model,
    img: np.ndarray,
    *,
    name: str,
    source_size,
    config: str,
    checkpoint: Optional[str],
    overrides: dict,
    device: str,
    upsample: str = 'banded',
    progress: Optional[Progress] = None,
) -> Tuple[np.ndarray, HighResResult]:
    """Predict one image and measure it: (labels, :class:`HighResResult` without
    outputs). The record's ``quadratic_warning`` is :func:`quadratic_warning` at this size
    (a program shows it before calling, see ``tools/infer_highres.py``)."""
    import torch

    hw = tuple(img.shape[:2])
    backbone = image_backbone(model)
    warn = quadratic_warning(backbone, hw)
    base_rss, per_image = rss_baseline()
    cuda = str(device).startswith('cuda')
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    labels, times = predict_labels(model, img, upsample=upsample, progress=progress)
    peak = max(peak_rss_bytes(), base_rss)
    return labels, HighResResult(
        image=name,
        input_size=list(hw),
        source_size=list(source_size),
        config=config,
        checkpoint=checkpoint,
        random_weights=has_random_weights(model),
        overrides=dict(overrides),
        backbone=backbone_summary(backbone),
        device=str(device),
        time_s=round(times['time_s'], 4),
        forward_s=round(times['forward_s'], 4),
        upsample_s=None if 'upsample_s' not in times else round(times['upsample_s'], 4),
        upsample=times['upsample'],
        peak_rss_mb=round(peak / MB, 1),
        baseline_rss_mb=round(base_rss / MB, 1),
        peak_increase_mb=round((peak - base_rss) / MB, 1),
        peak_is_per_image=per_image,
        torch_threads=torch.get_num_threads(),
        num_classes=len(model.dataset_meta['classes']),
        labels_present=int(len(np.unique(labels))),
        test_cfg=dict(model.test_cfg),
        quadratic_warning=warn,
        cuda_max_allocated_mb=round(torch.cuda.max_memory_allocated() / MB, 1) if cuda else None,
    )
