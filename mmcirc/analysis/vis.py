"""What the attention-visualisation tools (``tools/analysis/bccb_score.py``,
``vis_circulant.py``, ``vis_cores.py``) need from the libraries (the model itself is
:func:`mmcirc.apis.builder.build_model`'s: random weights are ``init_weights`` under a
fixed seed): an image run through the config's test pipeline and data
preprocessor, and matplotlib figures written atomically (PNGs, then the JSON).

Bad input raises ``ValueError`` naming what is wrong; the tools turn it into their
one-line errors.
"""

import io
import json
import os.path as osp
import re

__all__ = [
    'MIN_SIDE',
    'inference_pipeline',
    'prepare_inputs',
    'display_image',
    'short_name',
    'subplots',
    'figure_png',
    'thumbnail',
    'overlay_map',
    'write_outputs',
]

#: Smallest network input side the tools accept (px).
MIN_SIDE = 32
#: Transform types left out of the test pipeline (the image is given as an array).
_LOADERS = ('Load',)
#: Transform types dropped when the image already has its exact size.
_RESIZERS = ('Resize', 'Crop', 'Pad')


# --------------------------------------------------------------------------- input
def _type_name(t):
    t = t.get('type') if isinstance(t, dict) else t
    return t.__name__ if isinstance(t, type) else str(t).split('.')[-1]


def inference_pipeline(cfg, exact_size):
    """The config's test pipeline without loaders (and without resizes, crops and pads
    when ``exact_size``: the image already has the size wanted)."""
    loader = cfg.get('test_dataloader') or {}
    pipeline = (loader.get('dataset') or {}).get('pipeline') or cfg.get('test_pipeline')
    if not pipeline:
        raise ValueError(f'{cfg.filename}: no test pipeline (test_dataloader.dataset.pipeline)')
    drop = _LOADERS + (_RESIZERS if exact_size else ())
    return [t for t in pipeline if not any(k in _type_name(t) for k in drop)]


def prepare_inputs(model, cfg, img, exact_size):
    """Image (H, W, 3) BGR uint8 -> the backbone's input (1, 3, H', W') after the test
    pipeline and the model's data preprocessor. Raises ``ValueError`` when a side of
    the input is below :data:`MIN_SIDE` or the backbone's ``min_input_size``."""
    import torch
    from mmengine.dataset import Compose, pseudo_collate
    from mmengine.registry import init_default_scope

    init_default_scope(cfg.default_scope)
    pipe = Compose(inference_pipeline(cfg, exact_size))
    h, w = img.shape[:2]
    results = dict(
        img=img,
        img_shape=(h, w),
        ori_shape=(h, w),
        img_path='',
        img_id=0,
        sample_idx=0,
        scale_factor=(1.0, 1.0),
    )
    data = pipe(results)
    with torch.no_grad():
        data = model.data_preprocessor(pseudo_collate([data]), False)
    inputs = data['inputs']  # (1, 3, H', W')
    h, w = inputs.shape[-2:]
    minimum = max(int(getattr(model.backbone, 'min_input_size', 1)), MIN_SIDE)
    if min(h, w) < minimum:
        raise ValueError(
            f'the network input is {h}x{w}, below the minimum {minimum}x{minimum} '
            f'of {type(model.backbone).__name__}'
        )
    return inputs


def display_image(model, inputs):
    """The backbone input as an RGB float image in [0, 1] (H', W', 3), for overlays."""
    import torch

    dp = model.data_preprocessor
    x = inputs[0].detach().float().cpu()  # (3, H', W')
    mean, std = getattr(dp, 'mean', None), getattr(dp, 'std', None)
    if mean is not None and std is not None:
        x = x * std.float().cpu().view(-1, 1, 1) + mean.float().cpu().view(-1, 1, 1)
    rgb = any(
        bool(getattr(dp, a, False)) for a in ('_channel_conversion', 'channel_conversion', 'to_rgb')
    )
    if not rgb and x.shape[0] == 3:  # still in cv2's BGR order
        x = x.flip(0)
    x = x / 255.0 if x.max() > 1.5 else x
    return torch.clamp(x, 0, 1).permute(1, 2, 0).numpy()


# --------------------------------------------------------------------------- output
def short_name(name):
    """Module path -> file-name part (``backbone.layers.2.1.0.attn`` ->
    ``layers.2.1.0.attn``, characters other than [A-Za-z0-9._-] as '-')."""
    name = name[len('backbone.') :] if name.startswith('backbone.') else name
    return re.sub(r'[^A-Za-z0-9._-]', '-', name) or 'model'


def subplots(*args, figsize=None, dpi=None, **kwargs):
    """``(figure, axes)`` as ``plt.subplots`` gives them, on a ``matplotlib.figure.Figure``
    of its own: no pyplot, no backend chosen, nothing global changed (saving renders Agg)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi)
    return fig, fig.subplots(*args, **kwargs)


def figure_png(fig):
    """PNG bytes of a matplotlib figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=fig.dpi, bbox_inches='tight')
    return buf.getvalue()


def thumbnail(image, max_side=256):
    """Every k-th pixel of an (H, W, 3) image so that its longer side is <= max_side (a
    small panel shows no more; keeps the PNGs small)."""
    step = max(1, -(-max(image.shape[:2]) // max_side))
    return image[::step, ::step]


def overlay_map(ax, image, values, cmap='jet', alpha=0.55, title=None, vmin=0, vmax=None):
    """Paint a (h, w) map over an RGB image (stretched to the image's extent); colours
    span [vmin, vmax] (None: the map's own minimum / maximum)."""
    import numpy as np

    h, w = image.shape[:2]
    ax.imshow(thumbnail(image), extent=(0, w, h, 0))
    ax.imshow(
        np.asarray(values),
        cmap=cmap,
        alpha=alpha,
        extent=(0, w, h, 0),
        interpolation='bilinear',
        vmin=vmin,
        vmax=vmax,
    )
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=7)


def write_outputs(files, record, json_path):
    """Write ``files`` ({path: bytes}), then ``record`` as JSON to ``json_path``, each
    atomically and the JSON last; ``record['outputs']`` lists the file names."""
    from mmcirc.utils.fileio import atomic_write_many

    files = dict(files)
    record['outputs'] = sorted(osp.basename(p) for p in files) + [osp.basename(json_path)]
    files[json_path] = json.dumps(record, indent=2).encode()
    atomic_write_many(files)
