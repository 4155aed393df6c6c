"""The logits of an mmseg segmentor the way its own ``encode_decode`` makes them, for
inference paths that do the last resize and argmax themselves (a library).

mmseg's whole inference is ``encode_decode(inputs, metas)``: the backbone (and neck),
then the decode head's ``predict`` (a cascade: the last head's), which hands its logits
to ``predict_by_feat``, whose bilinear resize to the input size is the one step at full
resolution. :func:`encode_logits` runs that same ``encode_decode`` and takes the logits
where ``predict_by_feat`` would resize them; :func:`predict_head`,
:func:`check_label_segmentor` and :func:`lean_segmentor` say which segmentors it serves.
"""

import contextlib
from typing import List, Tuple

from mmcirc.utils.model_parts import image_backbone  # noqa: F401  (part of this API)

__all__ = [
    'check_label_segmentor',
    'encode_logits',
    'image_backbone',
    'lean_segmentor',
    'predict_head',
    'test_padding',
]


def predict_head(model):
    """The decode head whose ``predict`` mmseg's ``encode_decode`` calls: ``decode_head``,
    the last one of a cascade."""
    import torch.nn as nn

    head = model.decode_head
    return head[-1] if isinstance(head, nn.ModuleList) else head


def test_padding(model) -> bool:
    """Whether the data preprocessor pads images at test time (its ``test_cfg`` has a
    ``size`` or ``size_divisor``): mmseg then crops the padding off the logits."""
    pre = getattr(model, 'data_preprocessor', None)
    cfg = getattr(pre, 'test_cfg', None)
    return bool(cfg) and any(cfg.get(k) for k in ('size', 'size_divisor'))


def check_label_segmentor(model) -> None:
    """ValueError (one line) for a model whose prediction is not mmseg's per-pixel
    labels: not a segmentor, or one with a ``postprocess_result`` of its own."""
    from mmseg.models.segmentors import BaseSegmentor

    name = type(model).__name__
    if not isinstance(model, BaseSegmentor):
        raise ValueError(f'model must be an mmseg segmentor, got {name}')
    if type(model).postprocess_result is not BaseSegmentor.postprocess_result:
        raise ValueError(
            f'segmentor {name}: a postprocess_result of its own ({type(predict_head(model)).__name__}'
            "'s output is not mmseg's per-pixel class labels); high-resolution inference "
            'predicts the labels of an EncoderDecoder, CascadeEncoderDecoder or '
            'MultimodalEncoderDecoder'
        )


def lean_segmentor(model) -> bool:
    """Whether the labels may be :func:`encode_logits` resized and arg-maxed by the
    caller: mmseg's own ``EncoderDecoder`` or ``CascadeEncoderDecoder`` (not a subclass,
    which may predict otherwise), whole-image test mode, more than one output channel
    (one channel is thresholded) and no test-time padding."""
    from mmseg.models.segmentors import CascadeEncoderDecoder, EncoderDecoder

    return (
        type(model) in (EncoderDecoder, CascadeEncoderDecoder)
        and int(getattr(model, 'out_channels', 2)) > 1
        and model.test_cfg.get('mode', 'whole') == 'whole'
        and not test_padding(model)
    )


@contextlib.contextmanager
def _logits_before_resize(head):
    """While active, ``head.predict_by_feat`` (mmseg's ``BaseDecodeHead`` one only)
    returns the logits it is given, unresized, and keeps them in the yielded dict."""
    from mmseg.models.decode_heads.decode_head import BaseDecodeHead

    seen = {}
    if getattr(type(head), 'predict_by_feat', None) is not BaseDecodeHead.predict_by_feat:
        yield seen  # the head's own: its logits come at the input size
        return

    def keep(seg_logits, batch_img_metas, **kwargs):
        seen['logits'] = seg_logits
        return seg_logits

    head.predict_by_feat = keep
    try:
        yield seen
    finally:
        del head.predict_by_feat


def encode_logits(model, inputs, metas: List[dict]) -> Tuple[object, bool]:
    """mmseg's ``model.encode_decode(inputs, metas)`` -> ``(logits, resized)``: the logits
    ``predict_by_feat`` would resize to the input size (1, K, h, w) and False, or, for a
    head whose ``predict`` does not hand them to mmseg's ``predict_by_feat``, its logits
    at the input size and True. ``inputs`` may be any tensor the model's forwards take
    (a row-banded map: :mod:`mmcirc.distributed.segmentor`)."""
    head = predict_head(model)
    with _logits_before_resize(head) as seen:
        out = model.encode_decode(inputs, metas)
    if 'logits' not in seen:
        return out, True
    if out is not seen['logits']:  # predict changed them after predict_by_feat: mmseg's way
        return model.encode_decode(inputs, metas), True
    return out, False
