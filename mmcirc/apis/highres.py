"""High-resolution whole-image semantic segmentation with mmseg's own API.

The point of circulant (O(N log N)) and core (O(N C')) attention is that a pyramid made
only of them runs on a whole 4096 x 4096 image, where PVT's spatial-reduction attention
(quadratic: at 4096 px stage 1 has 1M queries x 16k reduced keys) cannot. This module
holds the reusable parts of ``tools/infer_highres.py``:

* :func:`load_highres_config` / :func:`apply_backbone_overrides`: load an mmseg config,
  apply backbone overrides (``num_cores``, ``boundary``, ``scale``,
  ``stage_attentions``) *before* the model is built, and force
  ``test_cfg=dict(mode='whole')`` (never sliding windows);
* :func:`build_segmentor`: ``mmseg.apis.init_model`` (plus ``init_weights`` and a
  warning when there is no checkpoint, SyncBN -> BN on the CPU, a dataset palette);
* :func:`predict_labels`: mmseg's whole inference of one image. ``upsample='mmseg'``
  calls the segmentor's own ``test_step`` (full-resolution logits, 150 x H x W floats:
  10 GB at 4096 px); ``upsample='banded'`` (default) runs the same data preprocessor,
  ``extract_feat`` and ``decode_head.forward`` and then does mmseg's bilinear resize +
  argmax over bands of classes, with a running first-maximum, so that only a band of
  full-resolution logits exists at a time. The labels are identical (bilinear
  interpolation is per channel and the arg-max keeps the first maximum, as
  ``torch.argmax``); the tests check it against ``mmseg.apis.inference_model``;
* :func:`quadratic_attention_estimates`: the attention-matrix memory of the stages
  whose blocks materialise one (``attention_matrix``: quadratic ``'sra'``, windowed
  ``'window'``) of a built backbone at a given size;
* :func:`run_dense_baseline`: the dense-attention equivalent (same config,
  ``stage_attentions`` = the family's own attention, i.e. mmdet's PVT-T with
  spatial-reduction attention everywhere) in a child process whose address space is
  capped with ``RLIMIT_AS``; reports whether it ran or ran out of memory, and when.

Memory figures are the process's peak resident set size (:mod:`mmcirc.utils.memory`);
before each image the kernel's high-water mark is reset (``/proc/self/clear_refs``,
Linux) when allowed, so that the peak is this image's.
"""
import json
import logging
import math
import os
import os.path as osp
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from mmcirc.models.backbones.pyramid import CORE_PRESETS, PyramidBackbone, registered_pyramids
from mmcirc.models.blocks import attention_kinds, block_classes
from mmcirc.ops.circulant import BOUNDARIES
from mmcirc.utils.cli import CLIError
from mmcirc.utils.fileio import atomic_write_many
from mmcirc.utils.memory import address_space_bytes, peak_rss_bytes, reset_peak_rss, rss_bytes

__all__ = [
    'BACKBONE_OVERRIDES', 'DEMO_IMAGES', 'HighResResult', 'apply_backbone_overrides',
    'build_segmentor', 'demo_image', 'figures_markdown', 'load_highres_config', 'min_input_size',
    'parse_size',
    'predict_labels', 'quadratic_attention_estimates', 'read_image', 'resize_image',
    'run_dense_baseline', 'upsample_argmax', 'validate_overrides', 'mmcirc_backbones'
]

#: Allowed values of the backbone overrides (num_cores: also an int in [1, num_cores_max];
#: stage_attentions: the kinds of the registered blocks, :func:`attention_kinds`).
BACKBONE_OVERRIDES = {
    'num_cores': tuple(CORE_PRESETS),
    'boundary': tuple(BOUNDARIES),
    'scale': ('sqrt_n', 'n'),
}
DEMO_IMAGES = ('astronaut', 'chelsea', 'coffee')
UPSAMPLE_MODES = ('banded', 'mmseg')
GB = 1024**3
MB = 1024**2


# --------------------------------------------------------------------------- inputs
def parse_size(text: Optional[str]) -> Union[None, int, Tuple[int, int]]:
    """``None`` (keep), ``'S'`` (longer side to S) or ``'HxW'`` (exact) -> None, int
    or (H, W). Raises :class:`CLIError` for anything else."""
    if text is None:
        return None
    t = str(text).strip().lower()
    try:
        if 'x' in t:
            h, w = (int(v) for v in t.split('x'))
            if h >= 1 and w >= 1:
                return h, w
        else:
            s = int(t)
            if s >= 1:
                return s
    except ValueError:
        pass
    raise CLIError(f'--size must be S (longer side, e.g. 4096) or HxW (e.g. 2048x3072) with '
                   f'positive integers, got {text!r}')


def resize_image(img: np.ndarray, size) -> np.ndarray:
    """Bicubic resize of an (H, W, 3) uint8 image: ``size`` as from :func:`parse_size`
    (int: longer side, aspect kept; (H, W): exact; None: unchanged)."""
    import mmcv
    if size is None:
        return img
    h, w = img.shape[:2]
    if isinstance(size, int):
        r = size / max(h, w)
        new_h, new_w = max(1, int(round(h * r))), max(1, int(round(w * r)))
    else:
        new_h, new_w = size
    if (new_h, new_w) == (h, w):
        return img
    return mmcv.imresize(img, (new_w, new_h), interpolation='bicubic')


def read_image(path: str) -> np.ndarray:
    """(H, W, 3) uint8 BGR image, as mmseg's ``LoadImageFromFile`` reads it (cv2).
    Raises ``CLIError('cannot read image: PATH')`` for a missing or undecodable file."""
    import mmcv
    try:
        with open(path, 'rb') as f:
            img = mmcv.imfrombytes(f.read(), flag='color')
    except Exception:  # noqa: BLE001  (missing, a folder, unreadable, corrupt)
        img = None
    if img is None or img.ndim != 3 or img.size == 0:
        raise CLIError(f'cannot read image: {path}')
    return img


def demo_image(name: str = 'astronaut') -> np.ndarray:
    """A scikit-image sample image (:data:`DEMO_IMAGES`) as (H, W, 3) uint8 BGR."""
    if name not in DEMO_IMAGES:
        raise CLIError(f'--demo must be one of {DEMO_IMAGES}, got {name!r}')
    try:
        import skimage.data
    except ImportError as err:
        raise CLIError(f'--demo needs scikit-image (pip install scikit-image): {err}') from None
    rgb = getattr(skimage.data, name)()
    if rgb.ndim == 2:
        rgb = np.stack([rgb] * 3, axis=-1)
    return np.ascontiguousarray(rgb[..., 2::-1])


# --------------------------------------------------------------------------- config
def validate_overrides(num_cores=None, boundary=None, scale=None,
                       stage_attentions=None) -> Dict[str, object]:
    """Check the backbone overrides given on the command line; returns the ones set
    (``num_cores`` as an int or preset name, ``scale`` as ``'sqrt_n'``/``'n'``/float,
    ``stage_attentions`` as a str or a tuple of 4). ``CLIError`` names the option and
    its allowed values."""
    out = {}
    if num_cores is not None:
        value = num_cores
        if isinstance(value, str) and value.strip().lstrip('-').isdigit():
            value = int(value)
        if isinstance(value, str) and value not in CORE_PRESETS:
            raise CLIError(f'--num-cores must be a positive int (<= num_cores_max, 64 by default) or '
                           f'one of {BACKBONE_OVERRIDES["num_cores"]}, got {num_cores!r}')
        if isinstance(value, int) and value < 1:
            raise CLIError(f'--num-cores must be a positive int (<= num_cores_max, 64 by default) or '
                           f'one of {BACKBONE_OVERRIDES["num_cores"]}, got {num_cores!r}')
        out['num_cores'] = value
    if boundary is not None:
        if boundary not in BACKBONE_OVERRIDES['boundary']:
            raise CLIError(f'--boundary must be one of {BACKBONE_OVERRIDES["boundary"]}, '
                           f'got {boundary!r}')
        out['boundary'] = boundary
    if scale is not None:
        value = scale
        if value not in BACKBONE_OVERRIDES['scale']:
            try:
                value = float(value)
            except (TypeError, ValueError):
                value = None
            if value is None or not math.isfinite(value) or value <= 0:
                raise CLIError(f'--scale must be one of {BACKBONE_OVERRIDES["scale"]} or a positive '
                               f'float, got {scale!r}')
        out['scale'] = value
    if stage_attentions is not None:
        kinds = stage_attentions
        if isinstance(kinds, str):
            kinds = [k.strip() for k in kinds.split(',')] if ',' in kinds else kinds
        choices = attention_kinds()
        for k in ([kinds] if isinstance(kinds, str) else kinds):
            if k not in choices:
                raise CLIError(f'--stage-attentions must be one of {choices} (or one per stage, comma '
                               f'separated), got {stage_attentions!r}')
        out['stage_attentions'] = kinds if isinstance(kinds, str) else tuple(kinds)
    return out


def mmcirc_backbones() -> Tuple[str, ...]:
    """Names of the registered backbones the overrides apply to (mmcirc's pyramids)."""
    return tuple(c.__name__ for classes in registered_pyramids().values() for c in classes)


def _backbone_class(type_name):
    from mmseg.registry import MODELS
    import mmcirc  # noqa: F401  (registers the backbones)
    return MODELS.get(type_name)


def apply_backbone_overrides(cfg, overrides: Dict[str, object]):
    """Write ``overrides`` (from :func:`validate_overrides`) into ``cfg.model.backbone``
    (in place) and check them against that backbone; returns ``cfg``.

    ``num_cores`` must not exceed the backbone's ``num_cores_max``; an override that
    the backbone's stages do not use (e.g. ``num_cores`` without core stages) is
    applied but warned about. ``CLIError`` for a backbone that is not one of mmcirc's.
    """
    if not overrides:
        return cfg
    backbone = cfg.model.backbone
    btype = backbone.get('type')
    cls = _backbone_class(btype) if isinstance(btype, str) else None
    if not (isinstance(cls, type) and issubclass(cls, PyramidBackbone)):
        raise CLIError(f'backbone overrides {sorted(overrides)} need an mmcirc backbone '
                       f'{mmcirc_backbones()}, the config has {btype!r}')
    if 'stage_attentions' in overrides:
        choices = cls.attention_choices()
        kinds = overrides['stage_attentions']
        for k in ([kinds] if isinstance(kinds, str) else kinds):
            if k not in choices:
                raise CLIError(f'--stage-attentions: {btype} takes {choices}, got {k!r}')
        backbone['stage_attentions'] = kinds if isinstance(kinds, str) else list(kinds)
    kinds = _configured_stage_attentions(backbone, cls)
    blocks = [block_classes(cls.family)[k] for k in kinds]
    if 'num_cores' in overrides:
        n = overrides['num_cores']
        n_max = backbone.get('num_cores_max', 64)
        if isinstance(n, int) and n > n_max:
            raise CLIError(f'--num-cores must be a positive int <= num_cores_max={n_max} or one of '
                           f'{BACKBONE_OVERRIDES["num_cores"]}, got {n}')
        if isinstance(n, str) and CORE_PRESETS[n] > n_max:
            raise CLIError(f'--num-cores {n} = {CORE_PRESETS[n]} exceeds num_cores_max={n_max}')
        backbone['num_cores'] = n
        if not any(b.carries_cores for b in blocks):
            warnings.warn(f'--num-cores has no effect: {btype} has no core stage {tuple(kinds)}')
    for key in ('boundary', 'scale'):
        if key in overrides:
            backbone[key] = overrides[key]
            if not any(key in b.options for b in blocks):
                warnings.warn(f'--{key} has no effect: {btype} has no circulant stage {tuple(kinds)}')
    return cfg


def _configured_stage_attentions(backbone_cfg, cls) -> Tuple[str, ...]:
    """The per-stage attentions a backbone config will build (the class's own parsing)."""
    keys = ('attention', 'stage_attentions', 'block_cfgs', 'arch')
    try:
        return cls.configured_stage_attentions(**{k: backbone_cfg[k] for k in keys if k in backbone_cfg})
    except ValueError as err:
        raise CLIError(str(err)) from None


def load_highres_config(config: str, cfg_options: Optional[dict] = None,
                        overrides: Optional[dict] = None):
    """Load an mmseg config for whole-image inference at any size.

    Merges ``cfg_options``, applies the backbone ``overrides`` and forces
    ``model.test_cfg = dict(mode='whole')`` (the previous value is kept in
    ``cfg.highres_replaced_test_cfg`` when it was different).
    """
    from mmengine.config import Config
    if not osp.isfile(config):
        raise CLIError(f'config file not found: {config}')
    import mmcirc  # noqa: F401
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('default_scope') != 'mmseg':
        raise CLIError(f'{config}: default_scope={cfg.get("default_scope")!r}; infer_highres '
                       "needs an mmseg segmentation config (inherit an mmseg:: base)")
    apply_backbone_overrides(cfg, overrides or {})
    old = cfg.model.get('test_cfg')
    if old is not None and dict(old) != dict(mode='whole'):
        cfg.highres_replaced_test_cfg = dict(old)
    cfg.model.test_cfg = dict(mode='whole')
    return cfg


def min_input_size(cfg) -> int:
    """The smallest image side the config's backbone accepts (its
    ``min_input_size``; 1 for backbones that do not state one). Builds the backbone
    alone, without weights: cheap next to the segmentor."""
    from mmseg.registry import MODELS
    backbone = MODELS.build(cfg.model.backbone)
    return int(getattr(backbone, 'min_input_size', 1))


# --------------------------------------------------------------------------- model
def _dataset_meta_from_cfg(cfg, num_classes: int) -> dict:
    """classes/palette from the config's metainfo or its test dataset class."""
    meta = {}
    for key in ('test_dataloader', 'val_dataloader', 'train_dataloader'):
        ds = cfg.get(key, {}) or {}
        ds = ds.get('dataset', {}) or {}
        if ds.get('metainfo'):
            meta = dict(ds['metainfo'])
            break
        if ds.get('type'):
            try:
                from mmseg.registry import DATASETS
                import mmseg.datasets  # noqa: F401
                meta = dict(DATASETS.get(ds['type']).METAINFO)
                break
            except Exception:  # noqa: BLE001
                continue
    if cfg.get('metainfo'):
        meta.update(cfg.metainfo)
    return _complete_meta(meta, num_classes)


def _complete_meta(meta: dict, num_classes: int) -> dict:
    classes = list(meta.get('classes') or [])
    palette = [list(map(int, c)) for c in (meta.get('palette') or [])]
    if len(classes) < num_classes:
        classes += [f'class_{i}' for i in range(len(classes), num_classes)]
    if len(palette) < num_classes:
        rng = np.random.RandomState(42)
        palette += rng.randint(0, 256, size=(num_classes - len(palette), 3)).tolist()
    return dict(classes=tuple(classes), palette=palette)


def build_segmentor(cfg, checkpoint: Optional[str] = None, device: str = 'cpu'):
    """``mmseg.apis.init_model(cfg, checkpoint, device)`` for whole-image inference.

    Without a checkpoint, warn that the weights are random (only time and memory mean
    anything) and run ``init_weights`` (mmseg's ``init_model`` leaves the modules at
    their constructor defaults). On the CPU, SyncBN layers become BN (as mmseg's
    demos do). ``model.dataset_meta`` always holds ``classes`` and ``palette`` (from the
    checkpoint, else the config), with at least ``num_classes`` entries.
    """
    from mmengine.model import revert_sync_batchnorm
    from mmseg.apis import init_model
    if checkpoint is not None and not osp.isfile(checkpoint):
        raise CLIError(f'checkpoint file not found: {checkpoint}')
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='.*dataset_meta or class names.*')
        model = init_model(cfg, checkpoint, device=device)
    if checkpoint is None:
        warnings.warn('no checkpoint: the weights are random, only the time and memory figures '
                      'are meaningful, not the masks')
        from mmengine.logging import MMLogger
        logger = MMLogger.get_current_instance()
        level = logger.level
        logger.setLevel(logging.WARNING)  # init_weights logs every parameter at INFO
        try:
            model.init_weights()
        finally:
            logger.setLevel(level)
        model.to(device)
        model.eval()
    if str(device).startswith('cpu'):
        model = revert_sync_batchnorm(model)
    head = getattr(model, 'decode_head', None)
    num_classes = int(getattr(head, 'num_classes', 0) or 0)
    meta = getattr(model, 'dataset_meta', None)
    if meta and meta.get('palette'):
        model.dataset_meta = _complete_meta(meta, num_classes)
    else:
        model.dataset_meta = _dataset_meta_from_cfg(model.cfg, num_classes)
    return model


def backbone_summary(backbone) -> dict:
    """Type, per-stage attention and the circulant/core settings of a built backbone."""
    out = dict(type=type(backbone).__name__)
    kinds = getattr(backbone, 'stage_attentions', None)
    if kinds is not None:
        out['stage_attentions'] = list(kinds)
        blocks = getattr(backbone, 'block_types', ())
        if any('boundary' in b.options for b in blocks):
            out['boundary'] = backbone.boundary
            out['scale'] = backbone.scale
        if any(b.carries_cores for b in blocks):
            out['num_cores'] = backbone.num_cores
            out['num_cores_max'] = backbone.num_cores_max
    return out


# --------------------------------------------------------------------------- memory
def _stage_grids(backbone, hw: Tuple[int, int]) -> List[Tuple[int, int]]:
    """Token grid (h, w) of each stage of an mmcirc pyramid for an H x W image
    (patch embeddings / mergings pad at the bottom-right, hence ceil)."""
    h, w = hw
    grids = []
    stem = getattr(backbone, 'patch_embed', None)
    if stem is not None:  # Swin
        s = stem.projection.stride[0]
        h, w = math.ceil(h / s), math.ceil(w / s)
    for stage in backbone.stages:
        if stage.patch_embed is not None:  # PVT
            s = stage.patch_embed.projection.stride[0]
            h, w = math.ceil(h / s), math.ceil(w / s)
        grids.append((h, w))
        if stage.downsample is not None:
            s = getattr(stage.downsample, 'sampler').stride
            s = s[0] if isinstance(s, (tuple, list)) else s
            h, w = math.ceil(h / s), math.ceil(w / s)
    return grids


def quadratic_attention_estimates(backbone, hw: Tuple[int, int]) -> List[dict]:
    """Attention-matrix memory of each stage whose blocks materialise one, at image size ``hw``.

    Each block says what it materialises (``attention_matrix``): ``'sra'`` (mmdet's PVT
    layer, ``nn.MultiheadAttention`` with ``need_weights``): queries = tokens N, keys =
    (h // sr) * (w // sr), quadratic in the image area; ``'window'`` (Swin): keys =
    window**2 per query (linear). The scores and their softmax, float32, per head:
    ``bytes ~= 2 * 4 * heads * queries * keys``. One dict per such stage: stage
    (1-based), attention, grid, queries, keys, heads, bytes.
    """
    out = []
    stages = list(backbone.stages)
    if not any(len(s.blocks) and getattr(s.blocks[0], 'attention_matrix', None) for s in stages):
        return out
    grids = _stage_grids(backbone, hw)
    for i, (stage, grid) in enumerate(zip(stages, grids)):
        if not len(stage.blocks) or not hasattr(stage.blocks[0], 'attention_matrix'):
            continue
        m = stage.blocks[0].attention_matrix(grid)
        if m is None:
            continue
        out.append(dict(stage=i + 1, attention=stage.attention, grid=list(grid), queries=m['queries'],
                        keys=m['keys'], heads=m['heads'], bytes=2 * 4 * m['heads'] * m['queries'] * m['keys']))
    return out


def memory_budget() -> Tuple[int, str]:
    """Bytes this process can still use: MemAvailable, or the RLIMIT_AS headroom when
    smaller. Returns (bytes, description)."""
    avail, what = None, 'unknown'
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    avail, what = int(line.split()[1]) * 1024, 'available RAM'
    except OSError:
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        left = soft - address_space_bytes()
        if avail is None or left < avail:
            avail, what = left, 'RLIMIT_AS headroom'
    return (avail if avail is not None else 1 << 62), what


def quadratic_warning(backbone, hw: Tuple[int, int]) -> Optional[str]:
    """One-line warning when a quadratic (``'sra'``) or windowed stage's attention
    would not fit in :func:`memory_budget` at size ``hw``; None otherwise."""
    est = quadratic_attention_estimates(backbone, hw)
    budget, what = memory_budget()
    bad = [e for e in est if e['bytes'] > budget]
    if not bad:
        return None
    parts = ', '.join(f"stage {e['stage']} ('{e['attention']}': {e['queries']} queries x {e['keys']} "
                      f"keys x {e['heads']} heads ~ {e['bytes'] / GB:.1f} GB)" for e in bad)
    quadratic = {k for k, b in block_classes().items() if b.quadratic}
    quad = all(e['attention'] in quadratic for e in bad)
    return (f"WARNING: at {hw[0]}x{hw[1]} the {'quadratic ' if quad else ''}attention of {parts} exceeds "
            f"the {budget / GB:.1f} GB of {what}; expect an out-of-memory failure. 'sra' stages are "
            f"quadratic in the image area: use an all-circulant or all-core pyramid (stage_attentions="
            f"'circulant' or 'core', e.g. configs/ca_pvt_t-allcirc_fpn_80k_ade20k.py)")


# --------------------------------------------------------------------------- inference
def upsample_argmax(logits, size: Sequence[int], align_corners: bool = False, band: int = 16):
    """``resize(logits, size, bilinear).argmax(1)[0]`` one band of ``band`` classes at a
    time: (1, C, h, w) logits -> (H, W) int64 labels, equal to the full computation with
    only a band of full-size logits in memory.

    Bilinear interpolation is per channel, and a strict ``>`` across bands keeps the
    first maximum, as ``torch.argmax`` does. Bit-exactness needs one more thing: torch's
    CPU kernel for small outputs (H + W <= 128) vectorises over channels, with a scalar
    tail whose rounding can differ by one ulp, so bands start at multiples of the
    widest SIMD width (``band`` must be a multiple of 16) and channel c takes the same
    path as in the full tensor.
    """
    import torch
    from mmseg.models.utils import resize
    assert logits.dim() == 4 and logits.shape[0] == 1, logits.shape
    if band < 1 or band % 16:
        raise ValueError(f'band must be a positive multiple of 16, got {band}')
    size = tuple(int(s) for s in size)
    best_val = labels = None
    for c0 in range(0, logits.shape[1], band):
        up = resize(logits[:, c0:c0 + band].contiguous(), size=size, mode='bilinear',
                    align_corners=align_corners, warning=False)[0]
        idx = up.argmax(dim=0)
        val = up.gather(0, idx[None])[0]
        del up
        if labels is None:
            best_val, labels = val, idx
        else:
            better = val > best_val
            best_val = torch.where(better, val, best_val)
            labels = torch.where(better, idx + c0, labels)
            del better
        del val, idx
    return labels


def _make_data(img: np.ndarray):
    """The dict ``PackSegInputs`` makes of a loaded image (no resize: we run at the
    given size): inputs = [uint8 (3, H, W) BGR tensor], one SegDataSample."""
    import torch
    from mmseg.structures import SegDataSample
    h, w = img.shape[:2]
    inputs = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
    sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w)))
    return dict(inputs=[inputs], data_samples=[sample])


def predict_labels(model, img: np.ndarray, upsample: str = 'banded', band: int = 16):
    """mmseg's whole-image inference of one (H, W, 3) uint8 BGR image -> ((H, W) int64
    label array, timings dict). See the module docstring for ``upsample``."""
    import torch
    from mmseg.models.segmentors import CascadeEncoderDecoder, EncoderDecoder
    if upsample not in UPSAMPLE_MODES:
        raise CLIError(f'--upsample must be one of {UPSAMPLE_MODES}, got {upsample!r}')
    head = getattr(model, 'decode_head', None)
    lean = (upsample == 'banded' and isinstance(model, EncoderDecoder)
            and not isinstance(model, CascadeEncoderDecoder) and getattr(head, 'out_channels', 2) > 1
            and model.test_cfg.get('mode', 'whole') == 'whole')
    data = _make_data(img)
    times = {}
    t0 = time.perf_counter()
    with torch.no_grad():
        if not lean:
            labels = model.test_step(data)[0].pred_sem_seg.data[0]
            times['forward_s'] = time.perf_counter() - t0
        else:
            data = model.data_preprocessor(data, False)
            inputs, samples = data['inputs'], data['data_samples']
            logits = head.forward(model.extract_feat(inputs))
            del inputs
            t1 = time.perf_counter()
            times['forward_s'] = t1 - t0
            meta = samples[0].metainfo
            size = meta.get('pad_shape', meta['img_shape'])[:2]
            assert tuple(size) == tuple(meta['ori_shape'][:2]) == img.shape[:2]
            labels = upsample_argmax(logits, size, head.align_corners, band=band)
            times['upsample_s'] = time.perf_counter() - t1
    times['time_s'] = time.perf_counter() - t0
    return labels.cpu().numpy(), dict(times, upsample='banded' if lean else 'mmseg')


# --------------------------------------------------------------------------- outputs
def colorize(labels: np.ndarray, palette) -> np.ndarray:
    """(H, W) labels -> (H, W, 3) uint8 RGB through the palette."""
    pal = np.asarray(palette, dtype=np.uint8).reshape(-1, 3)
    return pal[np.clip(labels, 0, len(pal) - 1)]


def overlay(img_bgr: np.ndarray, color_rgb: np.ndarray, opacity: float) -> np.ndarray:
    """Blend the colour mask over the image: (1 - opacity) * img + opacity * mask (BGR)."""
    out = img_bgr.astype(np.float32) * (1 - opacity)
    out += color_rgb[..., ::-1].astype(np.float32) * opacity
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def encode_png(arr: np.ndarray) -> bytes:
    import cv2
    ok, buf = cv2.imencode('.png', arr)
    if not ok:
        raise CLIError(f'cannot encode a PNG of shape {arr.shape}')
    return buf.tobytes()


def write_atomic(files: Dict[str, bytes]) -> None:
    """Write the image's files all or nothing (:func:`mmcirc.utils.fileio.atomic_write_many`;
    in the given order: put the JSON last)."""
    atomic_write_many(files)


@dataclass
class HighResResult:
    """One image's record (the JSON written beside its PNGs)."""
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
    forward_s: float
    upsample: str
    peak_rss_mb: float
    baseline_rss_mb: float
    peak_increase_mb: float
    peak_is_per_image: bool
    torch_threads: int
    num_classes: int
    labels_present: int
    test_cfg: dict = field(default_factory=lambda: dict(mode='whole'))
    upsample_s: Optional[float] = None
    cuda_max_allocated_mb: Optional[float] = None
    quadratic_warning: Optional[str] = None
    outputs: dict = field(default_factory=dict)
    dense_baseline: Optional[dict] = None

    def to_dict(self) -> dict:
        return asdict(self)


def run_image(model, img: np.ndarray, *, name: str, source_size, config: str,
              checkpoint: Optional[str], overrides: dict, device: str,
              upsample: str = 'banded') -> Tuple[np.ndarray, HighResResult]:
    """Predict one image and measure it: (labels, :class:`HighResResult` without
    outputs). Peak memory: RSS high-water mark reset before the image when possible."""
    import torch
    hw = tuple(img.shape[:2])
    warn = quadratic_warning(model.backbone, hw) if isinstance(model.backbone, PyramidBackbone) else None
    if warn:
        print(warn, file=sys.stderr, flush=True)
    per_image = reset_peak_rss()
    base_rss = rss_bytes() if per_image else peak_rss_bytes()
    cuda = str(device).startswith('cuda')
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    labels, times = predict_labels(model, img, upsample=upsample)
    peak = max(peak_rss_bytes(), base_rss)
    return labels, HighResResult(
        image=name, input_size=list(hw), source_size=list(source_size), config=config,
        checkpoint=checkpoint, random_weights=checkpoint is None, overrides=dict(overrides),
        backbone=backbone_summary(model.backbone), device=str(device),
        time_s=round(times['time_s'], 4), forward_s=round(times['forward_s'], 4),
        upsample_s=None if 'upsample_s' not in times else round(times['upsample_s'], 4),
        upsample=times['upsample'], peak_rss_mb=round(peak / MB, 1),
        baseline_rss_mb=round(base_rss / MB, 1), peak_increase_mb=round((peak - base_rss) / MB, 1),
        peak_is_per_image=per_image, torch_threads=torch.get_num_threads(),
        num_classes=len(model.dataset_meta['classes']), labels_present=int(len(np.unique(labels))),
        test_cfg=dict(model.test_cfg), quadratic_warning=warn,
        cuda_max_allocated_mb=round(torch.cuda.max_memory_allocated() / MB, 1) if cuda else None)


# --------------------------------------------------------------------------- dense baseline
_OOM_MARKERS = ("can't allocate memory", 'cannot allocate memory', 'not enough memory',
                'out of memory', 'unable to allocate', 'std::bad_alloc')


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, MemoryError):
        return True
    text = str(err).lower()
    return any(m in text for m in _OOM_MARKERS)


def run_dense_baseline(config: str, img: np.ndarray, *, checkpoint: Optional[str] = None,
                       cfg_options: Optional[dict] = None, stage_attentions: Optional[str] = None,
                       mem_cap_gb: float = 20.0, device: str = 'cpu', timeout: float = 1800,
                       upsample: str = 'banded') -> dict:
    """Run the dense-attention equivalent of ``config`` on ``img`` in a child process
    with ``RLIMIT_AS = mem_cap_gb`` GiB and report what happened.

    The child builds the same config with ``stage_attentions`` set to the family's own
    attention (``'sra'`` for PVT: mmdet's ``PVTEncoderLayer`` in every stage, i.e. the
    original PVT; ``'window'`` for Swin) and runs :func:`predict_labels`. Returns a
    dict: status (``'ok'``, ``'out_of_memory'``, ``'killed'``, ``'timeout'``, ``'error'``),
    time_s (inference, or until the failure), build_s, wall_s (whole child), error,
    peak_rss_mb, mem_cap_gb, stage_attentions, attention estimates, returncode.
    """
    cap = int(mem_cap_gb * GB)
    tmpdir = tempfile.mkdtemp(prefix='mmcirc_dense_')
    spec = dict(config=osp.abspath(config), checkpoint=checkpoint, cfg_options=cfg_options or {},
                stage_attentions=stage_attentions, device=device, upsample=upsample,
                image=osp.join(tmpdir, 'img.npy'), result=osp.join(tmpdir, 'result.json'))
    np.save(spec['image'], img)
    with open(osp.join(tmpdir, 'spec.json'), 'w') as f:
        json.dump(spec, f)
    log_path = osp.join(tmpdir, 'child.log')
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get('PYTHONPATH', ''))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t0 = time.perf_counter()
    status, rc = None, None
    try:
        with open(log_path, 'wb') as log:
            proc = subprocess.Popen(
                [sys.executable, '-c', 'from mmcirc.apis.highres import _child_main; _child_main()',
                 osp.join(tmpdir, 'spec.json')], stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=limit)
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
            result['error'] = (f'killed by signal {-rc}' if rc is not None and rc < 0
                               else (lines[-1] if lines else f'exit code {rc}'))
            if status == 'error' and is_out_of_memory(Exception(result['error'])):
                status = 'out_of_memory'
        result.update(status=status, returncode=rc, wall_s=round(wall, 2), mem_cap_gb=mem_cap_gb,
                      input_size=list(img.shape[:2]))
        result.setdefault('time_s', None)
        return result
    finally:
        for name in os.listdir(tmpdir):
            os.remove(osp.join(tmpdir, name))
        os.rmdir(tmpdir)


def _child_main(argv: Optional[List[str]] = None) -> None:
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
        img = np.load(spec['image'])
        cfg = load_highres_config(spec['config'], spec['cfg_options'])
        cls = _backbone_class(cfg.model.backbone.type)
        dense = spec['stage_attentions'] or cls.original_attention
        apply_backbone_overrides(cfg, dict(stage_attentions=dense))
        model = build_segmentor(cfg, spec['checkpoint'], device=spec['device'])
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
        labels, times = predict_labels(model, img, upsample=spec['upsample'])
        out.update(status='ok', time_s=round(times['time_s'], 3), labels_present=int(len(np.unique(labels))))
    except BaseException as err:  # noqa: BLE001  (report, whatever it is)
        if t0 is not None:
            out['time_s'] = round(time.perf_counter() - t0, 3)
        out['status'] = 'out_of_memory' if is_out_of_memory(err) else 'error'
        out['error'] = f'{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ""}'
        out['failed_during'] = 'inference' if t0 is not None else 'setup'
    out['peak_rss_mb'] = round(peak_rss_bytes() / MB, 1)
    if out.get('baseline_rss_mb') is not None:
        out['peak_increase_mb'] = round(out['peak_rss_mb'] - out['baseline_rss_mb'], 1)
    with open(spec['result'] + '.tmp', 'w') as f:
        json.dump(out, f)
    os.replace(spec['result'] + '.tmp', spec['result'])
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------- figures
def short_error(error: str) -> str:
    """torch's allocator message -> 'cannot allocate 64.0 GiB'; else the first 90 chars."""
    import re
    m = re.search(r'tried to allocate (\d+) bytes', error)
    if m:
        return f'cannot allocate {int(m.group(1)) / GB:.1f} GiB'
    return error[:90]


def figures_markdown(records: Sequence[dict]) -> str:
    """A markdown table of JSON records (as written by ``tools/infer_highres.py``):
    the efficient runs, and each record's dense baseline as its own row."""
    rows = ['| model | attention per stage | input | status | time (s) | peak RSS (GB) | '
            'increase over baseline (GB) |',
            '|---|---|---|---|---|---|---|']
    for r in records:
        is_run = bool(r.get('backbone'))  # an efficient run (else a --baseline-only record)
        if is_run:
            b = r['backbone']
            kinds = '-'.join(b.get('stage_attentions', []))
            extra = []
            if 'num_cores' in b:
                extra.append(f"C'={b['num_cores']}")
            if 'boundary' in b:
                extra.append(f"{b['boundary']}, {b['scale']}")
            name = osp.splitext(osp.basename(r['config']))[0]
            rows.append(f"| {name} ({'; '.join(extra)}) | {kinds} | {r['input_size'][0]}x{r['input_size'][1]} | "
                        f"ran | {r['time_s']:.1f} | {r['peak_rss_mb'] / 1024:.2f} | "
                        f"{r['peak_increase_mb'] / 1024:.2f} |")
        d = r.get('dense_baseline') if is_run else r
        if d and 'status' in d:
            kinds = '-'.join(d.get('stage_attentions') or [])
            t = d.get('time_s')
            status = 'ran' if d['status'] == 'ok' else (
                f"FAILED ({d['status']}{': ' + short_error(d['error']) if d.get('error') else ''})")
            when = '' if d['status'] == 'ok' else ' until failure'
            inc = d.get('peak_increase_mb')
            rows.append(f"| dense baseline, RLIMIT_AS {d['mem_cap_gb']:g} GB | {kinds} | "
                        f"{d['input_size'][0]}x{d['input_size'][1]} | {status} | "
                        f"{'-' if t is None else f'{t:.1f}'}{when} | {d.get('peak_rss_mb', 0) / 1024:.2f} | "
                        f"{'-' if inc is None else f'{inc / 1024:.2f}'} |")
    return '\n'.join(rows) + '\n'
