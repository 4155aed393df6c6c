"""The one model builder of mmcirc's tools and APIs: a config's model (an mmdet detector,
an mmseg segmentor, an mmpretrain classifier or a bare backbone) in eval mode.

:func:`build_model` does what the libraries' ``init_detector`` / ``init_model`` do, in
one way for all three: the library is the config's ``default_scope``, pretrained-weight
downloads are off (:func:`strip_pretrained`), the backbone overrides are applied before
building, a checkpoint loads through mmengine's ``load_checkpoint`` with mmcirc's safe
loader (:func:`mmcirc.engine.install_safe_loader`), SyncBN becomes BN. The caller's
config is never edited: the model's ``cfg`` is the edited copy.
"""

import copy
import importlib
import logging
import os.path as osp
import re
import warnings
from typing import List, Optional

__all__ = [
    'CONFIG_EXTENSIONS',
    'check_config_path',
    'build_model',
    'dataset_meta',
    'has_random_weights',
    'check_cfg_options',
    'load_model_config',
    'strip_pretrained',
]


def strip_pretrained(cfg) -> List[str]:
    """Switch off pretrained-weight loading in a config (an mmengine ``Config``: its
    ``model``) or a model config, in place: every ``init_cfg=dict(type='Pretrained',
    ...)`` (also inside a list of initialisers, the others kept) and every
    ``pretrained=...``. Returns the checkpoints dropped."""
    from mmengine.config import Config

    node = cfg.get('model', {}) if isinstance(cfg, Config) else cfg
    dropped = []
    if isinstance(node, dict):
        init = node.get('init_cfg')
        inits = init if isinstance(init, (list, tuple)) else [init]
        pretrained = [i for i in inits if isinstance(i, dict) and i.get('type') == 'Pretrained']
        if pretrained:
            dropped += [str(i.get('checkpoint')) for i in pretrained]
            kept = [i for i in inits if not any(i is p for p in pretrained)]
            node['init_cfg'] = kept[0] if len(kept) == 1 else (kept or None)
        if node.get('pretrained') is not None:
            if node['pretrained'] is not False:
                dropped.append(str(node['pretrained']))
            node['pretrained'] = None
        for value in node.values():
            dropped += strip_pretrained(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            dropped += strip_pretrained(value)
    return dropped


#: Settings counted in whole steps (the loops', hooks' and data loaders'): an int only.
_COUNTS = re.compile(
    r'(^|\.)(max_iters|max_epochs|val_interval|val_begin|interval|max_keep_ckpts|batch_size|'
    r'num_workers|seed)$'
)


_ABSENT = object()


def _config_value(cfg, key: str):
    """The config's value at the dotted ``key`` (list items by index), or ``_ABSENT``."""
    node = cfg
    for part in key.split('.'):
        if isinstance(node, (list, tuple)):
            node = node[int(part)] if part.isdigit() and int(part) < len(node) else _ABSENT
        elif hasattr(node, 'get'):  # a dict, a ConfigDict or the Config
            node = node.get(part, _ABSENT)
        else:
            return _ABSENT
        if node is _ABSENT:
            return _ABSENT
    return node


def check_cfg_options(cfg, cfg_options: dict) -> None:
    """Overrides (``--cfg-options``) that keep the kind of the config's value: a
    number stays a number (an int where the config counts steps, :data:`_COUNTS`), a
    bool a bool; anything may replace a string, None or a container, and new keys are
    free. Otherwise a one-line ``ValueError`` naming the key."""
    for key, value in cfg_options.items():
        old = _config_value(cfg, key)
        if old is _ABSENT or old is None or value is None:
            continue
        if isinstance(old, bool):
            ok, kind = isinstance(value, bool), 'true or false (a bool)'
        elif isinstance(old, int) and _COUNTS.search(key):
            ok, kind = type(value) is int, 'a whole number (an int)'
        elif isinstance(old, (int, float)):
            ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), 'a number'
        else:
            continue
        if not ok:
            raise ValueError(
                f"cfg_options {key}={value!r}: {key} must be {kind}, as the config's {old!r}"
            )


#: The config files mmengine's ``Config.fromfile`` reads.
CONFIG_EXTENSIONS = ('.py', '.json', '.yaml', '.yml')


def check_config_path(path: str) -> None:
    """``FileNotFoundError`` unless ``path`` is a file, ``ValueError`` unless mmengine reads
    it as a config (:data:`CONFIG_EXTENSIONS`)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    if osp.splitext(path)[1].lower() not in CONFIG_EXTENSIONS:
        raise ValueError(
            f'config {path}: a config must be one of {", ".join(CONFIG_EXTENSIONS)} files'
        )


def load_model_config(cfg, cfg_options: Optional[dict] = None):
    """A copy of ``cfg`` (a config file path, an mmengine ``Config`` or a dict with
    ``model`` and ``default_scope``) with ``cfg_options`` merged. ``FileNotFoundError``
    for a missing file, ``ValueError`` for a file that is not a config
    (:data:`CONFIG_EXTENSIONS`) or a ``default_scope`` that is not mmdet, mmseg or
    mmpretrain, ``TypeError`` for anything else."""
    from mmengine.config import Config

    import mmcirc.models  # noqa: F401  (registration)
    from mmcirc.registry import LIBRARIES

    where = ''  # a file's errors start with its path
    if isinstance(cfg, str):
        check_config_path(cfg)
        where = f'{cfg}: '
        cfg = Config.fromfile(cfg)
    elif isinstance(cfg, Config):
        cfg = copy.deepcopy(cfg)
    elif isinstance(cfg, dict):
        cfg = Config(copy.deepcopy(dict(cfg)))
    else:
        raise TypeError(f'cfg must be a config path, an mmengine Config or a dict, got {cfg!r}')
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope')
    if scope not in LIBRARIES:
        raise ValueError(
            f'{where}default_scope must be one of {LIBRARIES} (inherit an mmdet::, mmseg:: '
            f'or mmpretrain:: base config), got {scope!r}'
        )
    if not isinstance(cfg.get('model'), dict):
        raise ValueError(
            f'{where}model must be a dict (the model config), got {cfg.get("model")!r}'
        )
    return cfg


def build_model(
    cfg,
    checkpoint: Optional[str] = None,
    device='cpu',
    overrides: Optional[dict] = None,
    *,
    cfg_options: Optional[dict] = None,
    init_weights: bool = True,
    seed: Optional[int] = None,
    warn_random: bool = False,
    allow_partial_weights: bool = False,
):
    """``cfg``'s model in eval mode on ``device`` (see the module docstring).

    Args:
        cfg: a config file path or an mmengine ``Config`` (see :func:`load_model_config`).
        checkpoint: weights to load (mmengine's ``load_checkpoint``); one that leaves
            tensors of the model missing or shaped otherwise is refused with a one-line
            :class:`~mmcirc.apis.weights.WeightsMismatchError` naming them, a file that
            is not a readable checkpoint with a one-line ``ValueError``; None: no file
            is read.
        device: where the model goes (built and loaded on the CPU first).
        overrides: backbone overrides (:func:`~mmcirc.apis.overrides.apply_backbone_overrides`;
            raw strings are validated).
        cfg_options: merged into the config first (``--cfg-options``).
        init_weights: without a checkpoint, run ``init_weights()``; False leaves the
            constructors' defaults (enough for FLOPs and shapes, and faster).
        seed: ``torch.manual_seed(seed)`` before building and before ``init_weights``.
        warn_random: warn when the weights are random (no checkpoint, or some not
            loaded): one :class:`~mmcirc.apis.weights.RandomWeightsWarning`.
        allow_partial_weights: load what fits and keep the rest of the model's tensors
            random (named by a one-line warning with ``warn_random``).

    Returns the model (``model.cfg``: the config it was built from; ``model.weights_fit``:
    the :class:`~mmcirc.apis.weights.WeightsFit` of the checkpoint, None without one
    (:func:`has_random_weights`); full models also ``model.dataset_meta``: classes and
    palette, see :func:`dataset_meta`).
    """
    import torch
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint

    from mmcirc.engine import install_safe_loader
    from mmcirc.registry import registries_by_library
    from mmcirc.utils.quiet import quiet_logger

    from .overrides import apply_backbone_overrides
    from .weights import RandomWeightsWarning, WeightsMismatchError, recording_fit, warn_partial

    if checkpoint is not None and not osp.isfile(checkpoint):
        raise FileNotFoundError(f'checkpoint file not found: {checkpoint}')
    cfg = load_model_config(cfg, cfg_options)
    apply_backbone_overrides(cfg, overrides or {})
    strip_pretrained(cfg)
    model_cfg = cfg.model
    full = 'backbone' in model_cfg or 'image_encoder' in model_cfg  # a segmentor or detector
    if full and model_cfg.get('data_preprocessor') is None and cfg.get('data_preprocessor'):
        model_cfg.data_preprocessor = cfg.data_preprocessor  # as mmengine's Runner does
    scope = cfg.default_scope
    init_default_scope(scope)
    if seed is not None:
        torch.manual_seed(seed)
    registry = registries_by_library().get(scope)
    if registry is None:
        raise ValueError(
            f'default_scope {scope!r} needs {scope} installed (pip install -r requirements.txt)'
        )
    model = registry.build(model_cfg)
    meta, fit = {}, None
    quiet = logging.ERROR if checkpoint is not None else logging.WARNING  # the fit: below
    with quiet_logger(quiet) as logger:  # init_weights / load_checkpoint log every tensor
        if checkpoint is not None:
            install_safe_loader()
            with recording_fit(model) as fit:
                loaded = _read_checkpoint(load_checkpoint, model, checkpoint, logger)
            meta = (loaded.get('meta') or {}) if isinstance(loaded, dict) else {}
        elif init_weights:
            if seed is not None:
                torch.manual_seed(seed)
            try:
                model.init_weights()
            except (AttributeError, TypeError) as err:  # e.g. mmseg's SAN without CLIP weights
                raise ValueError(
                    f'init_weights: {type(model).__name__} cannot make random weights here '
                    f'({type(err).__name__}: {err}); give a checkpoint'
                ) from None
    if fit is not None and not fit.complete:
        if not allow_partial_weights:
            raise WeightsMismatchError(checkpoint, fit)
        if warn_random:
            warn_partial(checkpoint, fit)
    if checkpoint is None and warn_random:
        warnings.warn(
            "no checkpoint: the weights are random, the results are no trained model's",
            RandomWeightsWarning,
        )
    model = revert_sync_batchnorm(model)
    model.to(device)
    model.eval()  # (some train() overrides, e.g. mmdet Swin's, return None: no chaining)
    model.cfg = cfg
    model.weights_fit = fit
    if full:
        model.dataset_meta = dataset_meta(cfg, meta, _num_classes(model))
    return model


def has_random_weights(model) -> bool:
    """Whether some weights of a :func:`build_model` model were not loaded from a
    checkpoint (none given, or loaded in part)."""
    fit = getattr(model, 'weights_fit', None)
    return fit is None or not fit.complete


def _read_checkpoint(load_checkpoint, model, checkpoint: str, logger):
    """mmengine's ``load_checkpoint`` of a local file. A file that is not a torch
    checkpoint (empty, truncated, text) is the safe loader's one-line
    :class:`~mmcirc.engine.CheckpointReadError` (a ``ValueError``) naming it and what is
    wrong, a pickle it refuses its ``UnsafeCheckpointError``; a checkpoint that holds
    no state dict (a list, a tensor) a one-line ``ValueError``."""
    from mmcirc.engine import CheckpointReadError

    try:
        return load_checkpoint(model, checkpoint, map_location='cpu', logger=logger)
    except CheckpointReadError:
        raise
    except (RuntimeError, IndexError, KeyError, AttributeError, TypeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f'cannot read {checkpoint}: not a checkpoint of weights: no state dict '
            f'({type(err).__name__}: {reason[:200]})'
        ) from None


def _num_classes(model) -> int:
    """The class count of the model's head (0 when it has none)."""
    heads = [getattr(model, a, None) for a in ('decode_head', 'bbox_head', 'head')]
    roi = getattr(model, 'roi_head', None)
    heads.append(getattr(roi, 'bbox_head', None))
    for head in heads:
        n = getattr(head, 'num_classes', None)
        if isinstance(n, int) and n > 0:
            return n
    return 0


def dataset_meta(cfg, checkpoint_meta: Optional[dict] = None, num_classes: int = 0) -> dict:
    """``classes`` and ``palette`` of a model: the checkpoint's ``dataset_meta`` (keys
    lower-cased, as mmdet does; or an old checkpoint's ``CLASSES`` / ``PALETTE``), else
    the config's dataset (its ``metainfo``, or its class's ``METAINFO``) updated by the
    config's ``metainfo``; both completed to ``num_classes`` entries (``class_<i>``,
    colours drawn under seed 42)."""
    ckpt = checkpoint_meta or {}
    if ckpt.get('dataset_meta'):
        meta = {k.lower(): v for k, v in ckpt['dataset_meta'].items()}
    elif ckpt.get('CLASSES'):
        meta = dict(classes=ckpt['CLASSES'], palette=ckpt.get('PALETTE'))
    else:
        meta = _meta_from_cfg(cfg)
    return _complete_meta(meta, num_classes)


def _meta_from_cfg(cfg) -> dict:
    meta = {}
    scope = cfg.get('default_scope')
    for key in ('test_dataloader', 'val_dataloader', 'train_dataloader'):
        ds = (cfg.get(key) or {}).get('dataset') or {}
        if ds.get('metainfo'):
            meta = dict(ds['metainfo'])
            break
        if isinstance(ds.get('type'), str):
            try:
                registry = importlib.import_module(f'{scope}.registry').DATASETS
                importlib.import_module(f'{scope}.datasets')
                meta = dict(registry.get(ds['type']).METAINFO)
                break
            except Exception:  # noqa: BLE001 (a wrapper or an unknown type: next loader)
                continue
    if cfg.get('metainfo'):
        meta.update(cfg.metainfo)
    return meta


def _complete_meta(meta: dict, num_classes: int) -> dict:
    import numpy as np

    meta = dict(meta)
    classes = list(meta.get('classes') or [])
    palette = meta.get('palette')
    palette = [list(map(int, c)) for c in palette] if isinstance(palette, (list, tuple)) else []
    if len(classes) < num_classes:
        classes += [f'class_{i}' for i in range(len(classes), num_classes)]
    n = max(num_classes, len(classes))
    if len(palette) < n:
        rng = np.random.RandomState(42)
        palette += rng.randint(0, 256, size=(n - len(palette), 3)).tolist()
    meta.update(classes=tuple(classes), palette=palette)
    return meta
