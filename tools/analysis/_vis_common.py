"""What the attention-visualisation tools share (bccb_score.py, vis_circulant.py,
vis_cores.py): the command line (CONFIG [CKPT] --img/--demo --size ...), the model built
with its library's own ``init_*`` helper (random weights: ``init_weights`` under a fixed
seed), the image run through the config's test pipeline and data preprocessor, atomic
PNG/JSON output and one-line errors."""
import copy
import io
import json
import logging
import os.path as osp
import re
import sys
import warnings

warnings.filterwarnings('ignore', message='.*pkg_resources.*')  # mmengine's import
from mmcirc.utils.cli import CLIError  # noqa: E402

#: Transform types left out of the test pipeline (the image is given as an array).
_LOADERS = ('Load', )
#: Transform types replaced by an exact resize when --size is given.
_RESIZERS = ('Resize', 'Crop', 'Pad')
MIN_SIDE = 32


def add_common_args(parser, tool):
    """CONFIG [CHECKPOINT] (--img PATH | --demo NAME) [--size HxW] [--out-dir] ..."""
    from mmengine.config import DictAction
    parser.add_argument('config', help='mmdet / mmseg / mmpretrain config file')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint (omit: random weights, '
                        'init_weights under --seed)')
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument('--img', metavar='PATH', help='image file')
    src.add_argument('--demo', metavar='NAME', help="scikit-image sample: 'astronaut' "
                     "(also 'chelsea', 'coffee')")
    parser.add_argument('--size', help='HxW: resize the image to exactly H x W (e.g. 512x512), '
                        'S: its longer side to S; either replaces the resizes and crops of the '
                        "config's test pipeline")
    parser.add_argument('--out-dir', default=f'work_dirs/analysis/{tool}', help='output folder')
    parser.add_argument('--seed', type=int, default=0, help='seed of random weights (0)')
    parser.add_argument('--device', default='cpu', help="'cpu' or e.g. 'cuda:0'")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value')
    return parser


def quiet_warnings():
    """Warnings as one line, without the libraries' deprecation noise."""
    warnings.filterwarnings('ignore', category=DeprecationWarning)
    warnings.filterwarnings('ignore', category=UserWarning)
    warnings.filterwarnings('ignore', message='.*pkg_resources.*')

    def show(message, category, filename, lineno, file=None, line=None):
        print(f'WARNING: {message}', file=sys.stderr, flush=True)

    warnings.showwarning = show


def check_args(args):
    """Checks that need no library: files exist, size well formed, device known."""
    from mmcirc.apis.highres import parse_size
    if not osp.isfile(args.config):
        raise CLIError(f'config file not found: {args.config}')
    if args.checkpoint is not None and not osp.isfile(args.checkpoint):
        raise CLIError(f'checkpoint file not found: {args.checkpoint}')
    size = parse_size(args.size)
    sides = (size, ) if isinstance(size, int) else (size or ())
    if any(s < MIN_SIDE for s in sides):
        raise CLIError(f'--size must be at least {MIN_SIDE} px per side (HxW, e.g. 512x512), '
                       f'got {args.size!r}')
    if not (args.device == 'cpu' or re.fullmatch(r'cuda(:\d+)?', args.device)):
        raise CLIError(f"--device must be 'cpu' or 'cuda[:N]', got {args.device!r}")
    if args.device.startswith('cuda'):
        import torch
        if not torch.cuda.is_available():
            raise CLIError(f'--device {args.device}: CUDA is not available here')
    return size


def load_image(args, size):
    """(name, BGR uint8 image, source) of --img / --demo, resized to --size if given."""
    from mmcirc.apis.highres import demo_image, read_image, resize_image
    if args.demo is not None:
        img, name, src = demo_image(args.demo), args.demo, f'skimage.data.{args.demo}()'
    else:
        img, name, src = read_image(args.img), osp.splitext(osp.basename(args.img))[0], args.img
    return name, resize_image(img, size), src


# --------------------------------------------------------------------------- model
def _strip_pretrained(node):
    """Remove ``init_cfg=dict(type='Pretrained', ...)`` and ``pretrained=...`` anywhere
    in a model config (random weights must not read or download files)."""
    if isinstance(node, dict):
        init = node.get('init_cfg')
        inits = init if isinstance(init, (list, tuple)) else [init]
        if any(isinstance(i, dict) and i.get('type') == 'Pretrained' for i in inits):
            kept = [i for i in inits if not (isinstance(i, dict) and i.get('type') == 'Pretrained')]
            node['init_cfg'] = kept[0] if len(kept) == 1 else (kept or None)
        if node.get('pretrained') is not None:
            node['pretrained'] = None
        for v in node.values():
            _strip_pretrained(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            _strip_pretrained(v)


def load_cfg(args):
    from mmcirc.utils.cli import load_config
    cfg = load_config(args.config, args.cfg_options)
    _strip_pretrained(cfg.model)
    return cfg


def build_model(cfg, checkpoint=None, device='cpu', seed=0):
    """The config's model through its library's ``init_*`` helper, in eval mode.

    Without a checkpoint the weights are ``init_weights()`` after
    ``torch.manual_seed(seed)`` (the same config's random-weight model).
    """
    import torch
    from mmengine.logging import MMLogger
    from mmengine.model import revert_sync_batchnorm
    scope = cfg.default_scope
    cfg = copy.deepcopy(cfg)  # the init_* helpers edit the config they get
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # init_weights / load_checkpoint log at INFO
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            # init_detector resets the filter to warn 'checkpoint is None': silence it
            warnings.showwarning = lambda *a, **k: None
            torch.manual_seed(seed)
            if scope == 'mmdet':
                from mmdet.apis import init_detector
                model = init_detector(cfg, checkpoint, device='cpu')
            elif scope == 'mmseg':
                from mmseg.apis import init_model
                model = init_model(cfg, checkpoint, device='cpu')
            else:
                from mmpretrain.apis import init_model
                model = init_model(cfg, checkpoint, device='cpu')
            if checkpoint is None:
                torch.manual_seed(seed)
                model.init_weights()
    finally:
        logger.setLevel(level)
    model = revert_sync_batchnorm(model)
    if not hasattr(model, 'backbone'):
        raise CLIError(f'{type(model).__name__} has no backbone attribute')
    return model.to(device).eval()


def _type_name(t):
    t = t.get('type') if isinstance(t, dict) else t
    return t.__name__ if isinstance(t, type) else str(t).split('.')[-1]


def test_pipeline(cfg, exact_size):
    """The config's test pipeline without loaders (and without resizes/crops/pads when
    the image was already resized to --size)."""
    loader = cfg.get('test_dataloader') or {}
    pipeline = (loader.get('dataset') or {}).get('pipeline') or cfg.get('test_pipeline')
    if not pipeline:
        raise CLIError(f'{cfg.filename}: no test pipeline (test_dataloader.dataset.pipeline)')
    drop = _LOADERS + (_RESIZERS if exact_size else ())
    return [t for t in pipeline if not any(k in _type_name(t) for k in drop)]


def prepare_inputs(model, cfg, img, exact_size):
    """Image (H, W, 3) BGR uint8 -> the backbone's input (1, 3, H', W') after the test
    pipeline and the model's data preprocessor."""
    import torch
    from mmengine.dataset import Compose, pseudo_collate
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    pipe = Compose(test_pipeline(cfg, exact_size))
    h, w = img.shape[:2]
    results = dict(img=img, img_shape=(h, w), ori_shape=(h, w), img_path='', img_id=0,
                   sample_idx=0, scale_factor=(1.0, 1.0))
    data = pipe(results)
    with torch.no_grad():
        data = model.data_preprocessor(pseudo_collate([data]), False)
    inputs = data['inputs']
    h, w = inputs.shape[-2:]
    minimum = int(getattr(model.backbone, 'min_input_size', 1))  # mmcirc pyramids state it
    if min(h, w) < max(minimum, MIN_SIDE):
        raise CLIError(f'the network input is {h}x{w}, below the minimum '
                       f'{max(minimum, MIN_SIDE)}x{max(minimum, MIN_SIDE)} of '
                       f'{type(model.backbone).__name__}: give a larger --size HxW')
    return inputs


def display_image(model, inputs):
    """The backbone input as an RGB float image in [0, 1] (H', W', 3), for overlays."""
    import torch
    dp = model.data_preprocessor
    x = inputs[0].detach().float().cpu()
    mean, std = getattr(dp, 'mean', None), getattr(dp, 'std', None)
    if mean is not None and std is not None:
        x = x * std.float().cpu().view(-1, 1, 1) + mean.float().cpu().view(-1, 1, 1)
    rgb = any(bool(getattr(dp, a, False)) for a in ('_channel_conversion', 'channel_conversion', 'to_rgb'))
    if not rgb and x.shape[0] == 3:  # still in cv2's BGR order
        x = x.flip(0)
    x = x / 255.0 if x.max() > 1.5 else x
    return torch.clamp(x, 0, 1).permute(1, 2, 0).numpy()


# --------------------------------------------------------------------------- output
def short_name(name):
    """Module path -> file-name part (``backbone.layers.2.1.0.attn`` ->
    ``layers.2.1.0.attn``, characters other than [A-Za-z0-9._-] as '-')."""
    name = name[len('backbone.'):] if name.startswith('backbone.') else name
    return re.sub(r'[^A-Za-z0-9._-]', '-', name) or 'model'


def figure_png(fig):
    """PNG bytes of a matplotlib figure (closed afterwards)."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=fig.dpi, bbox_inches='tight')
    plt.close(fig)
    return buf.getvalue()


def pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def write_outputs(files, record, json_path):
    """Write the PNGs, then the JSON (atomically, the JSON last)."""
    from mmcirc.utils.fileio import atomic_write_many
    files = dict(files)
    record['outputs'] = sorted(osp.basename(p) for p in files) + [osp.basename(json_path)]
    files[json_path] = json.dumps(record, indent=2).encode()
    atomic_write_many(files)


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
    ax.imshow(np.asarray(values), cmap=cmap, alpha=alpha, extent=(0, w, h, 0),
              interpolation='bilinear', vmin=vmin, vmax=vmax)
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=7)


def progress(n):
    """mmengine's progress bar over ``n`` tasks (printed to stdout)."""
    from mmengine.utils import ProgressBar
    return ProgressBar(n)
