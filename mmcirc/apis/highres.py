"""High-resolution whole-image semantic segmentation with mmseg's own API (a library).

The point of circulant (O(N log N)) and core (O(N C')) attention is that a model made
only of them runs on a whole 4096 x 4096 image, where PVT's spatial-reduction attention
(quadratic: at 4096 px stage 1 has 1M queries x 16k reduced keys) cannot. This module
is what a program calls; ``tools/infer_highres.py`` is the command line around it.

* :func:`validate_overrides` / :func:`apply_backbone_overrides` /
  :func:`load_highres_config`: load an mmseg config, apply backbone overrides
  (``num_cores``, ``boundary``, ``scale``, ``stage_attentions``) *before* the model is
  built, checked against what the backbone takes (its constructor, its registered
  blocks, or the model itself built on the ``meta`` device: VECA's core bank and
  chunk), and force ``test_cfg=dict(mode='whole')`` (never sliding windows);
* :func:`build_segmentor`: ``mmseg.apis.init_model`` (plus ``init_weights`` and a
  warning when there is no checkpoint, SyncBN -> BN on the CPU, a dataset palette);
* :func:`predict_labels`: mmseg's whole inference of one image. ``upsample='mmseg'``
  calls the segmentor's own ``test_step`` (full-resolution logits, 150 x H x W floats:
  10 GB at 4096 px); ``upsample='banded'`` (default) runs the same data preprocessor,
  ``extract_feat`` and the decode head and then does mmseg's bilinear resize + argmax
  over bands of classes, with a running first-maximum, so that only a band of
  full-resolution logits exists at a time. The labels are identical (bilinear
  interpolation is per channel and the arg-max keeps the first maximum, as
  ``torch.argmax``). ``progress`` (a callable) is told each backbone stage / block,
  the neck, the decode head and each band as it finishes (:func:`progress_units`);
* :func:`quadratic_attention_estimates` / :func:`quadratic_warning`: the
  attention-matrix memory of the stages whose blocks materialise one
  (``attention_matrix``: quadratic ``'sra'``, windowed ``'window'``) at a given size;
* :func:`run_image`: one image predicted and measured, as a :class:`HighResResult`.

Errors are ``ValueError`` / ``TypeError`` / ``FileNotFoundError`` whose message starts
with the parameter's name (e.g. ``num_cores must ...``); warnings name parameters the
same way. Memory figures are the process's peak resident set size
(:mod:`mmcirc.utils.memory`); before each image the kernel's high-water mark is reset
(``/proc/self/clear_refs``, Linux) when allowed, so that the peak is this image's.
"""

import inspect
import math
import os.path as osp
import resource
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mmcirc.models.backbones.pyramid import CORE_PRESETS, PyramidBackbone
from mmcirc.models.blocks import attention_kinds, block_classes
from mmcirc.ops.circulant import BOUNDARIES, CirculantAttention
from mmcirc.utils.memory import address_space_bytes, peak_rss_bytes, reset_peak_rss, rss_bytes

__all__ = [
    'BACKBONE_OVERRIDES',
    'OVERRIDE_KEYS',
    'UPSAMPLE_MODES',
    'HighResResult',
    'apply_backbone_overrides',
    'backbone_overrides_of',
    'backbone_summary',
    'build_segmentor',
    'is_out_of_memory',
    'load_highres_config',
    'min_input_size',
    'overridable_backbones',
    'predict_labels',
    'progress_units',
    'quadratic_attention_estimates',
    'quadratic_warning',
    'run_image',
    'upsample_argmax',
    'validate_overrides',
]

#: Allowed values of the backbone overrides (num_cores: also an int in [1, num_cores_max],
#: or what the model's own bank allows; stage_attentions: the kinds of the registered
#: blocks, :func:`attention_kinds`).
BACKBONE_OVERRIDES = {
    'num_cores': tuple(CORE_PRESETS),
    'boundary': tuple(BOUNDARIES),
    'scale': ('sqrt_n', 'n'),
}
#: Every backbone override, in the order they are applied.
OVERRIDE_KEYS = ('stage_attentions', 'num_cores', 'boundary', 'scale')
UPSAMPLE_MODES = ('banded', 'mmseg')
#: ``progress(what, done, total)``: ``what`` finished, ``done`` of ``total`` steps.
Progress = Callable[[str, int, int], None]
GB = 1024**3
MB = 1024**2


# --------------------------------------------------------------------------- config
def validate_overrides(
    num_cores=None, boundary=None, scale=None, stage_attentions=None
) -> Dict[str, object]:
    """Check the backbone overrides (e.g. given on a command line as strings); returns
    the ones set (``num_cores`` as an int or preset name, ``scale`` as
    ``'sqrt_n'``/``'n'``/float, ``stage_attentions`` as a str or a tuple). A
    ``ValueError`` starts with the parameter's name and lists its allowed values."""
    out = {}
    if num_cores is not None:
        value = num_cores
        if isinstance(value, str) and value.strip().lstrip('-').isdigit():
            value = int(value)
        if (
            (isinstance(value, str) and value not in CORE_PRESETS)
            or (isinstance(value, int) and value < 1)
            or not isinstance(value, (int, str))
        ):
            raise ValueError(
                f'num_cores must be a positive int (<= num_cores_max, 64 by default) or '
                f'one of {BACKBONE_OVERRIDES["num_cores"]}, got {num_cores!r}'
            )
        out['num_cores'] = value
    if boundary is not None:
        if boundary not in BACKBONE_OVERRIDES['boundary']:
            raise ValueError(
                f'boundary must be one of {BACKBONE_OVERRIDES["boundary"]}, got {boundary!r}'
            )
        out['boundary'] = boundary
    if scale is not None:
        value = scale
        if value not in BACKBONE_OVERRIDES['scale']:
            try:
                value = float(value)
            except (TypeError, ValueError):
                value = None
            if value is None or not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f'scale must be one of {BACKBONE_OVERRIDES["scale"]} or a positive '
                    f'float, got {scale!r}'
                )
        out['scale'] = value
    if stage_attentions is not None:
        kinds = stage_attentions
        if isinstance(kinds, str):
            kinds = [k.strip() for k in kinds.split(',')] if ',' in kinds else kinds
        choices = attention_kinds()
        for k in [kinds] if isinstance(kinds, str) else kinds:
            if k not in choices:
                raise ValueError(
                    f'stage_attentions must be one of {choices} (or one per stage, comma '
                    f'separated), got {stage_attentions!r}'
                )
        out['stage_attentions'] = kinds if isinstance(kinds, str) else tuple(kinds)
    return out


def _backbone_class(type_name):
    from mmseg.registry import MODELS
    import mmcirc  # noqa: F401  (registers the backbones)

    return MODELS.get(type_name)


def backbone_overrides_of(cls) -> Tuple[str, ...]:
    """The overrides (:data:`OVERRIDE_KEYS`) a backbone class takes: its constructor's
    parameters among them (``stage_attentions`` only where the class can say which
    attention kinds it takes, i.e. the pyramids)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return ()
    keys = tuple(k for k in OVERRIDE_KEYS if k in params)
    if not hasattr(cls, 'attention_choices'):
        keys = tuple(k for k in keys if k != 'stage_attentions')
    return keys


def overridable_backbones() -> Tuple[str, ...]:
    """Names of mmcirc's registered backbones (mmseg registry) that take an override."""
    from mmseg.registry import MODELS
    import mmcirc  # noqa: F401

    return tuple(
        name
        for name, cls in MODELS.module_dict.items()
        if inspect.isclass(cls)
        and cls.__module__.startswith('mmcirc.models.backbones')
        and backbone_overrides_of(cls)
    )


def apply_backbone_overrides(cfg, overrides: Dict[str, object]):
    """Write ``overrides`` (from :func:`validate_overrides`) into ``cfg.model.backbone``
    (in place) and check them against that backbone; returns ``cfg``.

    Pyramids (:class:`PyramidBackbone`): ``stage_attentions`` must be kinds the family
    takes, ``num_cores`` must not exceed ``num_cores_max``; an override that the
    configured stages do not use (e.g. ``num_cores`` without core stages) is applied
    but warned about. Other backbones (CA-DeiT, VECA): each override must be a
    constructor parameter, and the backbone is built with them on the ``meta`` device
    (no memory, no weights), so that its own checks run now (e.g. VECA's ``num_cores``:
    a multiple of its chunk within its core bank). ``ValueError`` otherwise.
    """
    if not overrides:
        return cfg
    backbone = cfg.model.backbone
    btype = backbone.get('type')
    cls = _backbone_class(btype) if isinstance(btype, str) else None
    takes = backbone_overrides_of(cls) if isinstance(cls, type) else ()
    if not takes:
        raise ValueError(
            f'backbone overrides {sorted(overrides)} need an mmcirc backbone '
            f'{overridable_backbones()}, the config has {btype!r}'
        )
    for key in OVERRIDE_KEYS:
        if key in overrides and key not in takes:
            raise ValueError(f'{key} does not apply to {btype}: it takes {takes}')
    if issubclass(cls, PyramidBackbone):
        _apply_to_pyramid(backbone, cls, overrides)
    else:
        for key in OVERRIDE_KEYS:
            if key in overrides:
                backbone[key] = overrides[key]
        _build_on_meta(backbone, cls)
    return cfg


def _apply_to_pyramid(backbone, cls, overrides) -> None:
    btype = cls.__name__
    if 'stage_attentions' in overrides:
        choices = cls.attention_choices()
        kinds = overrides['stage_attentions']
        for k in [kinds] if isinstance(kinds, str) else kinds:
            if k not in choices:
                raise ValueError(f'stage_attentions: {btype} takes {choices}, got {k!r}')
        backbone['stage_attentions'] = kinds if isinstance(kinds, str) else list(kinds)
    keys = ('attention', 'stage_attentions', 'block_cfgs', 'arch')
    kinds = cls.configured_stage_attentions(**{k: backbone[k] for k in keys if k in backbone})
    blocks = [block_classes(cls.family)[k] for k in kinds]
    if 'num_cores' in overrides:
        n = overrides['num_cores']
        n_max = backbone.get('num_cores_max', 64)
        if isinstance(n, int) and n > n_max:
            raise ValueError(
                f'num_cores must be a positive int <= num_cores_max={n_max} or one of '
                f'{BACKBONE_OVERRIDES["num_cores"]}, got {n}'
            )
        if isinstance(n, str) and CORE_PRESETS[n] > n_max:
            raise ValueError(f'num_cores {n} = {CORE_PRESETS[n]} exceeds num_cores_max={n_max}')
        backbone['num_cores'] = n
        if not any(b.carries_cores for b in blocks):
            warnings.warn(f'num_cores has no effect: {btype} has no core stage {tuple(kinds)}')
    for key in ('boundary', 'scale'):
        if key in overrides:
            backbone[key] = overrides[key]
            if not any(key in b.options for b in blocks):
                warnings.warn(f'{key} has no effect: {btype} has no circulant stage {tuple(kinds)}')


def _build_on_meta(backbone_cfg, cls):
    """Build the backbone with its config on the ``meta`` device (its constructor's
    checks, no memory) and return it; its own ValueError / TypeError propagate."""
    import torch

    kwargs = {k: v for k, v in backbone_cfg.items() if k not in ('type', 'init_cfg')}
    with torch.device('meta'):
        return cls(**kwargs)


def load_highres_config(
    config: str, cfg_options: Optional[dict] = None, overrides: Optional[dict] = None
):
    """Load an mmseg config for whole-image inference at any size.

    Merges ``cfg_options``, applies the backbone ``overrides`` and forces
    ``model.test_cfg = dict(mode='whole')`` (the previous value is kept in
    ``cfg.highres_replaced_test_cfg`` when it was different). ``FileNotFoundError`` for
    a missing file, ``ValueError`` for a config that is not mmseg's.
    """
    from mmengine.config import Config

    if not osp.isfile(config):
        raise FileNotFoundError(f'config file not found: {config}')
    import mmcirc  # noqa: F401

    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('default_scope') != 'mmseg':
        raise ValueError(
            f'{config}: default_scope={cfg.get("default_scope")!r}; whole-image '
            'segmentation needs an mmseg segmentation config (inherit an mmseg:: base)'
        )
    apply_backbone_overrides(cfg, overrides or {})
    old = cfg.model.get('test_cfg')
    if old is not None and dict(old) != dict(mode='whole'):
        cfg.highres_replaced_test_cfg = dict(old)
    cfg.model.test_cfg = dict(mode='whole')
    return cfg


def min_input_size(cfg) -> int:
    """The smallest image side the config's backbone accepts (its
    ``min_input_size``; 1 for backbones that do not state one). Builds the backbone
    alone on the ``meta`` device: no weights, no memory."""
    cls = _backbone_class(cfg.model.backbone.type)
    return int(getattr(_build_on_meta(cfg.model.backbone, cls), 'min_input_size', 1))


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
        raise FileNotFoundError(f'checkpoint file not found: {checkpoint}')
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='.*dataset_meta or class names.*')
        model = init_model(cfg, checkpoint, device=device)
    if checkpoint is None:
        warnings.warn(
            'no checkpoint: the weights are random, only the time and memory figures '
            'are meaningful, not the masks'
        )
        from mmcirc.utils.quiet import quiet_logger

        with quiet_logger():  # init_weights logs every parameter at INFO
            model.init_weights()
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
    """Type, per-stage attention and the circulant/core settings of a built backbone.

    Pyramids say it through their blocks (``block_types``: options, carries_cores);
    other backbones through their modules: the circulant attention's ``boundary`` /
    ``scale``, the model's ``num_cores`` / ``num_cores_max`` (VECA)."""
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
    circ = next((m for m in backbone.modules() if isinstance(m, CirculantAttention)), None)
    if circ is not None:
        out['boundary'] = circ.boundary
        out['scale'] = circ.scale
    if getattr(backbone, 'num_cores', None) is not None and hasattr(backbone, 'num_cores_max'):
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
    (1-based), attention, grid, queries, keys, heads, bytes. Backbones without
    pyramid stages (CA-DeiT: O(N log N), VECA: O(N C')) have none.
    """
    out = []
    if not isinstance(backbone, PyramidBackbone):
        return out
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
        out.append(
            dict(
                stage=i + 1,
                attention=stage.attention,
                grid=list(grid),
                queries=m['queries'],
                keys=m['keys'],
                heads=m['heads'],
                bytes=2 * 4 * m['heads'] * m['queries'] * m['keys'],
            )
        )
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
    if not est:
        return None
    budget, what = memory_budget()
    bad = [e for e in est if e['bytes'] > budget]
    if not bad:
        return None
    parts = ', '.join(
        f"stage {e['stage']} ('{e['attention']}': {e['queries']} queries x {e['keys']} "
        f'keys x {e["heads"]} heads ~ {e["bytes"] / GB:.1f} GB)'
        for e in bad
    )
    quadratic = {k for k, b in block_classes().items() if b.quadratic}
    quad = all(e['attention'] in quadratic for e in bad)
    return (
        f'WARNING: at {hw[0]}x{hw[1]} the {"quadratic " if quad else ""}attention of {parts} exceeds '
        f"the {budget / GB:.1f} GB of {what}; expect an out-of-memory failure. 'sra' stages are "
        f'quadratic in the image area: use an all-circulant or all-core pyramid (stage_attentions='
        f"'circulant' or 'core', e.g. configs/ca_pvt_t-allcirc_fpn_80k_ade20k.py)"
    )


_OOM_MARKERS = (
    "can't allocate memory",
    'cannot allocate memory',
    'not enough memory',
    'out of memory',
    'unable to allocate',
    'std::bad_alloc',
)


def is_out_of_memory(err: BaseException) -> bool:
    """Whether an exception is an allocation failure (MemoryError, torch's allocators)."""
    if isinstance(err, MemoryError):
        return True
    text = str(err).lower()
    return any(m in text for m in _OOM_MARKERS)


# --------------------------------------------------------------------------- inference
def upsample_argmax(
    logits,
    size: Sequence[int],
    align_corners: bool = False,
    band: int = 16,
    on_band: Optional[Callable[[int, int], None]] = None,
):
    """``resize(logits, size, bilinear).argmax(1)[0]`` one band of ``band`` classes at a
    time: (1, C, h, w) logits -> (H, W) int64 labels, equal to the full computation with
    only a band of full-size logits in memory. ``on_band(k, n)`` is called after band
    k of n (1-based).

    Bilinear interpolation is per channel, and a strict ``>`` across bands keeps the
    first maximum, as ``torch.argmax`` does. Bit-exactness needs one more thing: torch's
    CPU kernel for small outputs (H + W <= 128) vectorises over channels, with a scalar
    tail whose rounding can differ by one ulp, so bands start at multiples of the
    widest SIMD width (``band`` must be a multiple of 16) and channel c takes the same
    path as in the full tensor.
    """
    import torch
    from mmseg.models.utils import resize

    if logits.dim() != 4 or logits.shape[0] != 1:
        raise ValueError(f'logits must be (1, C, h, w), got {tuple(logits.shape)}')
    if band < 1 or band % 16:
        raise ValueError(f'band must be a positive multiple of 16, got {band}')
    size = tuple(int(s) for s in size)
    num_bands = -(-logits.shape[1] // band)
    best_val = labels = None
    for k, c0 in enumerate(range(0, logits.shape[1], band)):
        up = resize(
            logits[:, c0 : c0 + band].contiguous(),
            size=size,
            mode='bilinear',
            align_corners=align_corners,
            warning=False,
        )[0]  # (band, H, W)
        idx = up.argmax(dim=0)  # (H, W)
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
        if on_band is not None:
            on_band(k + 1, num_bands)
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


def progress_units(model) -> List[Tuple[str, object]]:
    """[(name, module)] whose forward ends are the progress steps of one image, in
    order: the backbone's stages (pyramids' public ``stages``) or blocks (isotropic
    models' ``blocks``), else the backbone; the neck(s); the decode head (its
    classifier ``conv_seg``, which both inference paths call)."""
    backbone = model.backbone
    units = []
    for attr, word in (('stages', 'stage'), ('blocks', 'block')):
        parts = getattr(backbone, attr, None)
        if parts is not None and len(parts):
            units += [(f'backbone {word} {i + 1}/{len(parts)}', m) for i, m in enumerate(parts)]
            break
    else:
        units.append(('backbone', backbone))
    if getattr(model, 'with_neck', False):
        units.append(('neck', model.neck))
    head = getattr(model, 'decode_head', None)
    if head is not None:
        units.append(('decode head', getattr(head, 'conv_seg', None) or head))
    return units


def _use_banded(model, upsample: str) -> bool:
    from mmseg.models.segmentors import CascadeEncoderDecoder, EncoderDecoder

    head = getattr(model, 'decode_head', None)
    return (
        upsample == 'banded'
        and isinstance(model, EncoderDecoder)
        and not isinstance(model, CascadeEncoderDecoder)
        and getattr(head, 'out_channels', 2) > 1
        and model.test_cfg.get('mode', 'whole') == 'whole'
    )


def predict_labels(
    model,
    img: np.ndarray,
    upsample: str = 'banded',
    band: int = 16,
    progress: Optional[Progress] = None,
):
    """mmseg's whole-image inference of one (H, W, 3) uint8 BGR image -> ((H, W) int64
    label array, timings dict). See the module docstring for ``upsample``.

    ``progress(what, done, total)`` (optional; default quiet) is called when each of
    :func:`progress_units` finishes its forward, then after each band of the banded
    upsampling (``'mmseg'``: once, after mmseg's resize and argmax); ``total`` is the
    number of calls."""
    import torch

    if upsample not in UPSAMPLE_MODES:
        raise ValueError(f'upsample must be one of {UPSAMPLE_MODES}, got {upsample!r}')
    if progress is not None and not callable(progress):
        raise TypeError(f'progress must be None or a callable(what, done, total), got {progress!r}')
    head = getattr(model, 'decode_head', None)
    lean = _use_banded(model, upsample)
    units = progress_units(model) if progress is not None else []
    total = len(units) + (-(-int(head.out_channels) // band) if lean else 1)
    done = [0]

    def step(what):
        done[0] += 1
        progress(what, done[0], total)

    hooks = [
        m.register_forward_hook(lambda mod, args, out, name=name: step(name)) for name, m in units
    ]
    data = _make_data(img)
    times = {}
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            if not lean:
                labels = model.test_step(data)[0].pred_sem_seg.data[0]
                times['forward_s'] = time.perf_counter() - t0
                if progress is not None:
                    step('upsample')
            else:
                data = model.data_preprocessor(data, False)
                inputs, samples = data['inputs'], data['data_samples']
                logits = head(
                    model.extract_feat(inputs)
                )  # (1, classes, H/4, W/4) for FPN / UperNet
                del inputs
                t1 = time.perf_counter()
                times['forward_s'] = t1 - t0
                meta = samples[0].metainfo
                size = meta.get('pad_shape', meta['img_shape'])[:2]
                assert tuple(size) == tuple(meta['ori_shape'][:2]) == img.shape[:2]
                on_band = (
                    None if progress is None else (lambda k, n: step(f'upsample band {k}/{n}'))
                )
                labels = upsample_argmax(
                    logits, size, head.align_corners, band=band, on_band=on_band
                )
                times['upsample_s'] = time.perf_counter() - t1
    finally:
        for h in hooks:
            h.remove()
    times['time_s'] = time.perf_counter() - t0
    return labels.cpu().numpy(), dict(times, upsample='banded' if lean else 'mmseg')


# --------------------------------------------------------------------------- result
@dataclass
class HighResResult:
    """One image's record (the JSON ``tools/infer_highres.py`` writes beside its PNGs)."""

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
    outputs). Peak memory: RSS high-water mark reset before the image when possible.
    The record's ``quadratic_warning`` is :func:`quadratic_warning` at this size
    (a program shows it before calling, see ``tools/infer_highres.py``)."""
    import torch

    hw = tuple(img.shape[:2])
    warn = quadratic_warning(model.backbone, hw)
    per_image = reset_peak_rss()
    base_rss = rss_bytes() if per_image else peak_rss_bytes()
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
        random_weights=checkpoint is None,
        overrides=dict(overrides),
        backbone=backbone_summary(model.backbone),
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
