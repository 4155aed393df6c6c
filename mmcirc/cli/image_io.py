"""Image input and output of the image tools (``tools/infer_highres.py`` and the
attention visualisations in ``tools/analysis``): ``--size`` parsing, reading an image
file or a scikit-image demo image, bicubic resizing, palettes, overlays and PNG
encoding (the commands write them all or nothing:
:func:`mmcirc.utils.fileio.atomic_write_many`). Its errors are one-line ``ValueError``
messages naming the flag, which the commands print as their ``error:`` line.
"""

import os.path as osp
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

DEMO_IMAGES = ('astronaut', 'chelsea', 'coffee')
#: Bytes a pixel of a resized image takes at least: the (H, W, 3) uint8 image and its
#: float32 copy, the network's input (the model's own memory comes on top).
PIXEL_BYTES = 3 + 3 * 4


def parse_size(text: Optional[str]) -> Union[None, int, Tuple[int, int]]:
    """``None`` (keep), ``'S'`` (longer side to S) or ``'HxW'`` (exact) -> None, int
    or (H, W). Raises ``ValueError`` (``--size ...``) for anything else."""
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
    raise ValueError(
        f'--size must be S (longer side, e.g. 4096) or HxW (e.g. 2048x3072) with '
        f'positive integers, got {text!r}'
    )


def resize_image(img: np.ndarray, size) -> np.ndarray:
    """Bicubic resize of an (H, W, 3) uint8 image: ``size`` as from :func:`parse_size`
    (int: longer side, aspect kept; (H, W): exact; None: unchanged). A ``ValueError``
    naming ``--size`` first when the new image, with its network input
    (:data:`PIXEL_BYTES` a pixel), would not fit in the memory this process can still use
    (:func:`mmcirc.analysis.attention_memory.memory_budget`)."""
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
    from mmcirc.analysis.attention_memory import GB, memory_budget

    need = new_h * new_w * PIXEL_BYTES
    budget, what = memory_budget()
    if need > budget:
        given = size if isinstance(size, int) else f'{size[0]}x{size[1]}'
        raise ValueError(
            f'--size {given}: a {new_h}x{new_w} image and its network input take '
            f'{need / GB:,.1f} GB, more than the {budget / GB:,.1f} GB of {what}; '
            'give a smaller --size'
        )
    return mmcv.imresize(img, (new_w, new_h), interpolation='bicubic')


def read_image(path: str) -> np.ndarray:
    """(H, W, 3) uint8 BGR image, as mmseg's ``LoadImageFromFile`` reads it (cv2).
    Raises ``ValueError('cannot read image: PATH')`` for a missing or undecodable file."""
    import mmcv

    try:
        with open(path, 'rb') as f:
            img = mmcv.imfrombytes(f.read(), flag='color')
    except Exception:  # noqa: BLE001  (missing, a folder, unreadable, corrupt)
        img = None
    if img is None or img.ndim != 3 or img.size == 0:
        raise ValueError(f'cannot read image: {path}')
    return img


def demo_image(name: str = 'astronaut') -> np.ndarray:
    """A scikit-image sample image (:data:`DEMO_IMAGES`) as (H, W, 3) uint8 BGR."""
    if name not in DEMO_IMAGES:
        raise ValueError(f'--demo must be one of {DEMO_IMAGES}, got {name!r}')
    try:
        import skimage.data
    except ImportError as err:
        raise ValueError(f'--demo needs scikit-image (pip install scikit-image): {err}') from None
    rgb = getattr(skimage.data, name)()
    if rgb.ndim == 2:
        rgb = np.stack([rgb] * 3, axis=-1)
    return np.ascontiguousarray(rgb[..., 2::-1])


def output_names(paths: Sequence[str]) -> List[str]:
    """The name each image file's outputs are made of, distinct within one call: its
    file name without the extension, or, where two inputs share that, every input's
    path relative to their common parent (``a/x``, ``b/x``; written into those
    subfolders). Two inputs that would still share a name (the same file twice, ``x.png``
    beside ``x.jpg``) are a ``ValueError`` naming both."""
    names = [osp.splitext(osp.basename(p))[0] for p in paths]
    if len(set(names)) < len(names):
        full = [osp.abspath(p) for p in paths]
        parent = osp.commonpath([osp.dirname(p) for p in full])
        names = [osp.splitext(osp.relpath(p, parent))[0] for p in full]
    seen = {}
    for path, name in zip(paths, names):
        if name in seen:
            raise ValueError(
                f'--img: {seen[name]} and {path} would write the same outputs ({name}_*); '
                'give each image once, under distinct names'
            )
        seen[name] = path
    return names


def load_images(paths: Optional[Sequence[str]], demo: Optional[str], size) -> List[tuple]:
    """``[(name, image, source (H, W), source)]`` of the image files ``paths`` (names:
    :func:`output_names`) or, with ``demo``, of that :func:`demo_image`: BGR uint8,
    resized to ``size`` (:func:`resize_image`). Every image is read before this
    returns, so that a bad path fails before anything runs."""
    if demo is not None:
        src = [(demo, demo_image(demo), f'skimage.data.{demo}()')]
    else:
        src = [(n, read_image(p), p) for n, p in zip(output_names(paths), paths)]
    return [(name, resize_image(img, size), img.shape[:2], where) for name, img, where in src]


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
    """PNG bytes of an (H, W) or (H, W, 3) BGR uint8/uint16 array (cv2)."""
    import cv2

    ok, buf = cv2.imencode('.png', arr)
    if not ok:
        raise ValueError(f'cannot encode a PNG of shape {arr.shape}')
    return buf.tobytes()
