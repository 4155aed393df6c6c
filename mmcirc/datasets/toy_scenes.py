"""The toy scenes of :mod:`mmcirc.datasets.toy_data`: coloured shapes on a textured
two-tone background ("sky" above a slightly tilted horizon, "ground" below), drawn from
one ``numpy.random.Generator``. Polygons are rasterised with ``PIL.ImageDraw``; circles
are 32-gons.

This module depends on numpy and Pillow only.
"""

import math

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    'TOY_DET_CLASSES',
    'TOY_DET_PALETTE',
    'TOY_SEG_CLASSES',
    'TOY_SEG_PALETTE',
    'TOY_CLS_CLASSES',
    'render_scene',
]

# Shape classes shared by all three datasets. Alphabetical on purpose: it is
# the order mmpretrain's CustomDataset infers from the class sub-folders.
_SHAPES = ('circle', 'square', 'triangle')
# Per-shape fill colour (jittered per object) and circumradius scale (a
# triangle looks smaller than a circle of the same circumradius).
_SHAPE_COLORS = ((220, 40, 40), (40, 190, 60), (50, 60, 225))
_SHAPE_SCALE = (1.0, 0.95, 1.15)
_SHAPE_VERTICES = (32, 4, 3)

#: Detection / instance-segmentation classes of ``toy_coco`` (category ids 1..3).
TOY_DET_CLASSES = _SHAPES
#: Visualisation palette for ``TOY_DET_CLASSES`` (mmdet ``metainfo['palette']``).
TOY_DET_PALETTE = [list(c) for c in _SHAPE_COLORS]
#: Classification classes of ``toy_imagenet`` (labels 0..2, folder names).
TOY_CLS_CLASSES = _SHAPES
#: Semantic classes of ``toy_ade``; stored in the PNGs as 1..K (0 = unlabelled),
#: i.e. indices 0..K-1 after ``reduce_zero_label=True``.
TOY_SEG_CLASSES = ('sky', 'ground') + _SHAPES
#: Palette for ``TOY_SEG_CLASSES`` (mmseg ``metainfo['palette']``).
TOY_SEG_PALETTE = [[135, 180, 230], [120, 95, 70]] + TOY_DET_PALETTE

_SKY_COLOR = (150, 180, 215)
_GROUND_COLOR = (115, 95, 70)


def _smooth_field(rng, width, height, cells=4):
    """Bilinearly upsampled uniform noise in [-1, 1] (elementwise only, so
    results do not depend on BLAS)."""
    grid = rng.uniform(-1.0, 1.0, size=(cells + 1, cells + 1))
    gy = (np.arange(height) + 0.5) * (cells / height)
    gx = (np.arange(width) + 0.5) * (cells / width)
    y0 = np.minimum(gy.astype(np.int64), cells - 1)
    x0 = np.minimum(gx.astype(np.int64), cells - 1)
    fy = (gy - y0)[:, None]
    fx = (gx - x0)[None, :]
    top, bottom = (g[:, x0] * (1 - fx) + g[:, x0 + 1] * fx for g in (grid[y0], grid[y0 + 1]))
    return top * (1 - fy) + bottom * fy


def _polygon(cx, cy, radius, n_vertices, angle, width, height):
    """Integer polygon vertices, consecutive duplicates removed."""
    pts = []
    for k in range(n_vertices):
        a = angle + 2.0 * math.pi * k / n_vertices
        x = int(round(cx + radius * math.cos(a)))
        y = int(round(cy + radius * math.sin(a)))
        p = (min(max(x, 0), width - 1), min(max(y, 0), height - 1))
        if not pts or p != pts[-1]:
            pts.append(p)
    while len(pts) > 1 and pts[-1] == pts[0]:
        pts.pop()
    return pts


def render_scene(
    rng,
    width,
    height,
    num_objects=(1, 4),
    labels=None,
    size_range=(0.10, 0.22),
    min_center_dist=0.8,
):
    """One toy scene from ``rng``: shapes on a textured sky / ground background, a
    ``width`` x ``height`` image. ``labels``: the shape classes to draw (indices into
    ``TOY_DET_CLASSES``; None: a random number in the inclusive range ``num_objects`` of
    random ones); ``size_range``: a shape's circumradius as a fraction of ``min(width,
    height)``; two shapes' centres lie at least ``min_center_dist`` times the sum of their
    circumradii apart (a shape not placed in 50 tries is dropped; the first always fits).

    Returns ``image`` (H x W x 3 uint8 RGB), ``seg`` (H x W uint8: 0 unlabelled, the
    horizon and every shape outline; ``i + 1`` for ``TOY_SEG_CLASSES[i]``) and
    ``objects``: per shape ``label`` (index into ``TOY_DET_CLASSES``), ``polygon``
    (integer ``(x, y)`` vertices, drawing order) and ``mask`` (H x W bool, PIL's
    rasterisation of ``polygon``, pixels later covered by shapes on top included).
    """
    w, h = int(width), int(height)
    ys = np.arange(h, dtype=np.float64)[:, None]
    xs = np.arange(w, dtype=np.float64)[None, :]

    # Background: sky above a tilted horizon, ground below, each with a
    # jittered base colour and a low-frequency luminance texture.
    horizon0 = h * rng.uniform(0.3, 0.6)
    slope = rng.uniform(-0.15, 0.15)
    horizon = horizon0 + slope * (xs - w / 2.0)  # 1 x W
    is_sky = ys < horizon
    sky = np.asarray(_SKY_COLOR) + rng.integers(-15, 16, size=3)
    ground = np.asarray(_GROUND_COLOR) + rng.integers(-15, 16, size=3)
    img = np.where(is_sky[..., None], sky, ground).astype(np.float64)
    img += 25.0 * _smooth_field(rng, w, h)[..., None]
    seg = np.where(is_sky, 1, 2).astype(np.uint8)
    hrow = np.floor(horizon[0]).astype(np.int64)
    inside = (hrow >= 0) & (hrow < h)
    seg[hrow[inside], np.arange(w)[inside]] = 0

    if labels is None:
        n = int(rng.integers(num_objects[0], num_objects[1] + 1))
        labels = [int(rng.integers(len(_SHAPES))) for _ in range(n)]
    seg_img = Image.fromarray(seg, mode='L')
    seg_draw = ImageDraw.Draw(seg_img)
    objects, placed = [], []
    base = min(w, h)
    for label in labels:
        for _ in range(50):
            r = base * rng.uniform(*size_range) * _SHAPE_SCALE[label]
            r = min(r, (base - 3) / 2.0)
            cx = rng.uniform(r + 1, w - 2 - r)
            cy = rng.uniform(r + 1, h - 2 - r)
            if all(
                math.hypot(cx - px, cy - py) >= min_center_dist * (r + pr) for px, py, pr in placed
            ):
                break
        else:
            if objects:
                continue
        if label == 0:
            angle = 0.0
        elif label == 1:
            angle = math.pi / 4 + rng.uniform(-0.35, 0.35)
        else:
            angle = rng.uniform(0.0, 2.0 * math.pi)
        pts = _polygon(cx, cy, r, _SHAPE_VERTICES[label], angle, w, h)
        mask_img = Image.new('L', (w, h), 0)
        ImageDraw.Draw(mask_img).polygon(pts, fill=1, outline=1)
        mask = np.asarray(mask_img, dtype=bool)
        color = np.asarray(_SHAPE_COLORS[label]) + rng.integers(-25, 26, 3)
        img[mask] = color
        seg_draw.polygon(pts, fill=label + 3, outline=0)
        placed.append((cx, cy, r))
        objects.append(dict(label=label, polygon=pts, mask=mask))

    img += rng.normal(0.0, 6.0, size=img.shape)
    img = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return dict(image=img, seg=np.asarray(seg_img), objects=objects)
