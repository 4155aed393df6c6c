"""Parts of an OpenMMLab model that several layers look up."""


def image_backbone(model):
    """The image backbone of an mmdet / mmseg model or of its model config: ``backbone``
    (``EncoderDecoder``, detectors and their kind) or ``image_encoder``
    (``MultimodalEncoderDecoder``)."""
    for key in ('backbone', 'image_encoder'):
        part = model.get(key) if isinstance(model, dict) else getattr(model, key, None)
        if part is not None:
            return part
    raise ValueError(f'model has neither a backbone nor an image_encoder: {type(model).__name__}')
