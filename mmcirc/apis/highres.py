"""High-resolution whole-image semantic segmentation with mmseg's own API (a library;
``tools/infer_highres.py`` is its command line): a model made only of circulant and core
attention runs on a whole 4096 x 4096 image, where PVT's quadratic spatial-reduction
attention cannot.

* :func:`load_highres_config`: the config, whole inference forced (never sliding
  windows); the model is then :func:`~mmcirc.apis.builder.build_model`'s;
* :func:`predict_labels`: mmseg's whole inference of one image. ``upsample='mmseg'``
  calls the segmentor's own ``test_step`` (full-resolution logits, 150 x H x W floats:
  10 GB at 4096 px); ``upsample='banded'`` (default) runs the same data preprocessor
  and the segmentor's own ``encode_decode`` (cascades too), takes the logits where the
  head's ``predict_by_feat`` would resize them (:mod:`mmcirc.apis.decode`) and resizes
  and arg-maxes them a band of classes at a time (:func:`upsample_argmax`: the same
  labels). Segmentors the banded path does not cover (a subclass of mmseg's, one output
  channel, test-time padding) take ``test_step``.
"""

import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from mmcirc.utils.labels import banded_argmax

from .builder import load_model_config
from .decode import (
    check_label_segmentor,
    encode_logits,
    image_backbone,
    lean_segmentor,
    predict_head,
)
from .overrides import apply_backbone_overrides, backbone_on_meta

__all__ = [
    'UPSAMPLE_MODES',
    'load_highres_config',
    'make_data',
    'min_input_size',
    'predict_labels',
    'progress_units',
    'upsample_argmax',
]

UPSAMPLE_MODES = ('banded', 'mmseg')
#: test_cfg keys of mmseg's sliding-window inference, dropped in whole mode.
_SLIDE_KEYS = ('mode', 'crop_size', 'stride')
#: ``progress(what, done, total)``: ``what`` finished, ``done`` of ``total`` steps.
Progress = Callable[[str, int, int], None]


def load_highres_config(
    config: str, cfg_options: Optional[dict] = None, overrides: Optional[dict] = None
):
    """Load an mmseg config for whole-image inference at any size.

    Merges ``cfg_options``, applies the backbone ``overrides`` and forces
    ``model.test_cfg`` to ``mode='whole'`` without sliding-window settings (a decode
    head's own settings stay), the previous value kept in ``cfg.highres_replaced_test_cfg``
    when it was different. ``ValueError`` for a config that is not mmseg's.
    """
    if not isinstance(config, str):
        raise TypeError(f'config must be a config file path, got {config!r}')
    cfg = load_model_config(config, cfg_options)
    if cfg.get('default_scope') != 'mmseg':
        raise ValueError(
            f'{config}: default_scope={cfg.get("default_scope")!r}; whole-image '
            'segmentation needs an mmseg segmentation config (inherit an mmseg:: base)'
        )
    apply_backbone_overrides(cfg, overrides or {})
    old = dict(cfg.model.get('test_cfg') or {})
    whole = {k: v for k, v in old.items() if k not in _SLIDE_KEYS}
    whole['mode'] = 'whole'
    if old and old != whole:
        cfg.highres_replaced_test_cfg = old
    cfg.model.test_cfg = whole
    return cfg


def min_input_size(cfg) -> int:
    """The smallest image side the config's backbone accepts (its
    ``min_input_size``; 1 for backbones that do not state one). Builds a backbone that
    states one alone on the ``meta`` device: no weights, no memory."""
    from mmcirc.registry import model_registries

    backbone = image_backbone(cfg.model)
    btype = backbone.get('type')
    found = (r.get(btype) for r in model_registries()) if isinstance(btype, str) else [btype]
    cls = next((c for c in found if c is not None), None)
    if cls is None or not hasattr(cls, 'min_input_size'):
        return 1
    return int(backbone_on_meta(backbone).min_input_size)


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
    path as in the full tensor. Each band is written by the bilinear kernel of mmseg's
    resize (``aten.upsample_bilinear2d``) into one buffer made once (a fresh band would
    fault in its pages each time).
    """
    import torch

    if logits.dim() != 4 or logits.shape[0] != 1:
        raise ValueError(f'logits must be (1, C, h, w), got {tuple(logits.shape)}')
    if band < 1 or band % 16:
        raise ValueError(f'band must be a positive multiple of 16, got {band}')
    size = tuple(int(s) for s in size)
    num_bands = -(-logits.shape[1] // band)
    buf = logits.new_empty(1, min(band, logits.shape[1]), *size)  # (1, band, H, W)

    def bands():
        for k, c0 in enumerate(range(0, logits.shape[1], band)):
            src = logits[:, c0 : c0 + band].contiguous()  # (1, K_b, h, w)
            out = buf[:, : src.shape[1]]  # (1, K_b, H, W), contiguous
            torch.ops.aten.upsample_bilinear2d.out(src, size, align_corners, out=out)
            yield c0, out[0]  # (K_b, H, W)
            if on_band is not None:  # band k + 1 is merged once the next one is asked for
                on_band(k + 1, num_bands)

    return banded_argmax(bands())


def make_data(img: np.ndarray):
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
    models' ``blocks``), else the backbone (also a compiled one:
    :func:`mmcirc.engine.compile.is_compiled`); the neck(s); the decode head whose
    ``predict`` mmseg calls (:func:`~mmcirc.apis.decode.predict_head`; the end of its
    ``predict`` counts, which calls its ``forward`` without the module's hooks)."""
    from mmcirc.engine.compile import is_compiled

    backbone = image_backbone(model)
    units = []
    if backbone is not None:
        for attr, word in (('stages', 'stage'), ('blocks', 'block')):
            parts = getattr(backbone, attr, None)
            if parts is not None and len(parts) and not is_compiled(backbone):  # not in a graph
                units += [(f'backbone {word} {i + 1}/{len(parts)}', m) for i, m in enumerate(parts)]
                break
        else:
            units.append(('backbone', backbone))
    if getattr(model, 'with_neck', False):
        units.append(('neck', model.neck))
    if getattr(model, 'decode_head', None) is not None:
        units.append(('decode head', predict_head(model)))
    return units


def _then(func, after):
    """``func`` followed by ``after()``, returning what ``func`` returns."""

    def call(*args, **kwargs):
        out = func(*args, **kwargs)
        after()
        return out

    return call


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
    number of calls. A segmentor whose prediction is not mmseg's labels is refused
    before anything runs (:func:`~mmcirc.apis.decode.check_label_segmentor`)."""
    import torch

    if upsample not in UPSAMPLE_MODES:
        raise ValueError(f'upsample must be one of {UPSAMPLE_MODES}, got {upsample!r}')
    if progress is not None and not callable(progress):
        raise TypeError(f'progress must be None or a callable(what, done, total), got {progress!r}')
    check_label_segmentor(model)
    lean = upsample == 'banded' and lean_segmentor(model)
    units = progress_units(model) if progress is not None else []
    total = len(units) + (-(-int(model.out_channels) // band) if lean else 1)
    done = [0]

    def step(what):
        done[0] += 1
        progress(what, done[0], total)

    hooks = [
        m.register_forward_hook(lambda mod, args, out, name=name: step(name))
        for name, m in units
        if name != 'decode head'
    ]
    heads = [m for name, m in units if name == 'decode head']
    for head in heads:  # the end of its predict: an instance attribute, removed below
        head.predict = _then(head.predict, lambda: step('decode head'))
    data = make_data(img)
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
                metas = [s.metainfo for s in samples]
                # (1, classes, h, w): where predict_by_feat would resize them
                logits, _ = encode_logits(model, inputs, metas)
                del inputs
                t1 = time.perf_counter()
                times['forward_s'] = t1 - t0
                size = metas[0]['img_shape'][:2]
                assert tuple(size) == tuple(metas[0]['ori_shape'][:2]) == img.shape[:2]
                on_band = (
                    None if progress is None else (lambda k, n: step(f'upsample band {k}/{n}'))
                )
                align = predict_head(model).align_corners
                labels = upsample_argmax(logits, size, align, band=band, on_band=on_band)
                times['upsample_s'] = time.perf_counter() - t1
    finally:
        for h in hooks:
            h.remove()
        for head in heads:
            del head.predict
    times['time_s'] = time.perf_counter() - t0
    return labels.cpu().numpy(), dict(times, upsample='banded' if lean else 'mmseg')
