"""A built mmseg segmentor run band-wise on its own forwards, and band-wise inference.

The backbone (CA-PVT / Core-PVT: any mix of ``'circulant'``, ``'core'``, ``'sra'``
stages; CA-DeiT; VECA, whose cores ride as the token map's replicated prefix), the
neck and the decode head run on :class:`~mmcirc.distributed.banded_map.BandedMap` bands
the way mmseg's ``encode_decode`` runs them (the decode head's own ``predict``; a
cascade's heads in turn), the logits taken where ``predict_by_feat`` would resize them
(:func:`mmcirc.apis.decode.encode_logits`): every op they reach has a handler
(:mod:`mmcirc.distributed.handlers`) or is local.

:func:`check_shardable` finds what sharding does not support by tracing the band-wise
forward once on a small image (every rank together, or one process without a process
group); :func:`predict_sharded` is the inference entry: rank 0's image goes out band by
band, every rank predicts its band of labels, rank 0 gets the whole label map back.
"""

import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmcirc.apis.decode import check_label_segmentor, encode_logits, predict_head, test_padding
from mmcirc.utils.labels import banded_argmax

from ..banded_map import BandedMap, shard_operators
from ..comm import Layout, exchange_rows, gather_rows, group_rank_size
from ..layers import interpolate
from ..row_split import band_bounds, check_world_size

__all__ = ['check_shardable', 'map_heights', 'shard_model', 'ShardedSegmentor', 'predict_sharded']

_INSTEAD = (
    "sharded inference supports CA-PVT / Core-PVT ('circulant', 'core', 'sra' stages), "
    'CA-DeiT and VECA with the mmseg necks and heads whose ops have sharded handlers'
)


def _err(where: str, what: str) -> ValueError:
    return ValueError(f'{where}: {what}; {_INSTEAD}')


def load_operators() -> None:
    """Register the attention operators' BandedMap handlers (their modules' imports)."""
    from ..handlers import circulant, core, veca  # noqa: F401


# --------------------------------------------------------------------------- checks
def check_backbone(bb) -> None:
    """One-line ValueError for a backbone whose family the band-wise forward does not
    cover (Swin's windows, the Swin pyramid family, any other backbone)."""
    from mmcirc.models.backbones.ca_deit import CADeiT
    from mmcirc.models.backbones.pyramid import PyramidBackbone
    from mmcirc.models.backbones.veca import VECAViT

    name = type(bb).__name__
    if isinstance(bb, PyramidBackbone):
        kinds = tuple(getattr(s, 'attention', '?') for s in bb.stages)
        if 'window' in kinds:
            i = kinds.index('window')
            raise ValueError(
                f"{name} stage {i + 1} uses Swin's shifted-window attention ('window'), which "
                'sharded inference does not support (windows and their cyclic shift cross '
                "the row bands): set stage_attentions to 'circulant' or 'core' in a CA-PVT / "
                'Core-PVT config'
            )
        if bb.family != 'pvt':
            raise _err(name, f'the {bb.family!r} pyramid family (patch merging) is not supported')
    elif not isinstance(bb, (CADeiT, VECAViT)):
        raise _err(f'backbone {name}', 'not supported')


def trace_size(model, world_size: int) -> Tuple[int, int]:
    """A small image size at which every rank owns rows of every feature map, and every
    map has two rows at least (a one-row map leaves the token reshapes ambiguous)."""
    s = max(32, int(getattr(model.backbone, 'min_input_size', 1)))
    while True:
        try:
            check_world_size(map_heights(model, (s, s)), max(world_size, 2))
            return s, s
        except ValueError:
            s += 16


def trace(model, group, run, outside: str, label: str, batch: int = 1) -> None:
    """``run(model, x)`` once on a small random banded batch ``x`` of ``batch`` images
    (:func:`trace_size`); an error raised inside is re-raised as a one-line ValueError
    naming the innermost module (dotted path) whose forward was running, else
    ``<decode head>.<outside>`` (its own code outside a forward); an error that is not a
    handler's refusal (a ValueError starting with ``sharded``) is named by its type
    after ``label``."""
    stack, hooks = [], []
    for path, m in model.named_modules():
        if path:
            hooks.append(m.register_forward_pre_hook(lambda m, a, p=path: stack.append(p)))
            hooks.append(m.register_forward_hook(lambda m, a, o: stack.pop() and None))
    h, w = trace_size(model, group_rank_size(group)[1])
    torch.manual_seed(0)
    x = BandedMap.scatter(torch.randn(batch, 3, h, w), group=group)
    try:
        run(model, x)
    except Exception as err:
        where = stack[-1] if stack else f'{path_of(model, predict_head(model))}.{outside}'
        what = str(err).strip().splitlines()[0] if str(err).strip() else ''
        if not isinstance(err, ValueError) or not what.startswith('sharded '):
            what = f'{label}: {type(err).__name__}: {what}'.rstrip(': ')
        raise ValueError(f'{where}: {what}') from None
    finally:
        for hk in hooks:
            hk.remove()


def path_of(model, module) -> str:
    """The dotted path of ``module`` in ``model``."""
    return next(p for p, m in model.named_modules() if m is module)


def check_shardable(model, group=None) -> None:
    """Raise a one-line ValueError naming the first part of ``model`` (an mmseg
    segmentor) that sharded inference does not support: the segmentor, the backbone
    family, then the first module and op of a traced band-wise forward with no handler."""
    from mmseg.models.segmentors import CascadeEncoderDecoder, EncoderDecoder

    check_label_segmentor(model)
    if type(model) not in (EncoderDecoder, CascadeEncoderDecoder):
        raise _err(
            f'segmentor {type(model).__name__}',
            "only mmseg's EncoderDecoder and CascadeEncoderDecoder are supported",
        )
    if int(model.out_channels) < 2:
        raise _err(f'decode_head {type(predict_head(model)).__name__}',
                   'one output channel (thresholded, not arg-maxed) is not supported')  # fmt: skip
    check_backbone(model.backbone)
    for part in (model.backbone, getattr(model, 'neck', None), model.decode_head):
        for path, m in part.named_modules() if part is not None else ():
            if isinstance(m, _BatchNorm) and m.training:
                raise _err(path, f'{type(m).__name__} in training mode (call model.eval())')
    if test_padding(model):
        raise _err('data_preprocessor', 'test-time padding (test_cfg size / size_divisor)')
    load_operators()
    shard_operators(model)  # plain inputs still take the modules' own forwards

    def run(model, x):  # the band-wise forward, no gradients
        with torch.no_grad():
            _forward(model, x)

    trace(model, group, run, 'predict', 'sharded inference')


def map_heights(model, hw: Sequence[int]) -> List[int]:
    """Rows of the image and of every feature map of ``model`` at image size ``hw``
    (the backbone stages, the neck levels); the smallest bounds the world size."""
    from mmcirc.models.backbones.pyramid import PyramidBackbone

    bb, h = model.backbone, int(hw[0])
    heights = [h]
    if isinstance(bb, PyramidBackbone):
        grids = [g[0] for g in bb.stage_grids(hw)]
        heights += grids
        levels = [grids[i] for i in bb.out_indices]
    else:
        heights.append(-(-h // bb.patch_size))
        levels = [heights[-1]] * len(bb.out_indices)
    scales = getattr(getattr(model, 'neck', None), 'scales', None)
    if getattr(model, 'with_neck', False) and scales is not None:  # MultiLevelNeck
        src = levels if len(levels) > 1 else levels * len(scales)
        heights += [int(math.floor(s * f)) for s, f in zip(src, scales)]
    return heights


def check_size(model, hw: Sequence[int], world_size: int) -> None:
    """:func:`check_world_size` over :func:`map_heights` at image size ``hw``."""
    check_world_size(map_heights(model, hw), world_size, what=f'{hw[0]}x{hw[1]} image')


# --------------------------------------------------------------------------- forward
def _forward(model, x: BandedMap) -> BandedMap:
    """The band of the logits (1, K, H', W') where ``predict_by_feat`` would resize them
    (or at the image size, for a head that makes them there), by mmseg's own
    ``encode_decode`` on the bands (metas: the image's size, as ``make_data`` has it)."""
    hw = tuple(int(s) for s in x.shape[-2:])
    logits, _ = encode_logits(model, x, [dict(img_shape=hw, ori_shape=hw)])
    if not isinstance(logits, BandedMap) or logits.dim() != 4 or logits.band_dim != 2:
        what = type(logits).__name__ if not isinstance(logits, BandedMap) else 'map'
        raise ValueError(
            f'sharded inference: the logits of {type(predict_head(model)).__name__}.predict '
            f'are a {what} {tuple(logits.shape)}, not a (1, K, H, W) map banded along H'
        )
    return logits


def shard_model(model, group=None) -> 'ShardedSegmentor':
    """``model`` (an mmseg segmentor, eval mode) ready for band-wise inference: checked
    (:func:`check_shardable`, ValueError before any run) and the attention operators'
    forwards given their BandedMap handlers (weights shared, nothing copied)."""
    model.eval()
    check_shardable(model, group)
    return ShardedSegmentor(model, group)


class ShardedSegmentor(nn.Module):
    """``forward(band, height)``: this rank's rows of the image (1, 3, h_r, W) (uint8 BGR,
    as mmseg's data preprocessor takes it) of an image ``height`` rows high -> its
    band of the decode head's logits, a BandedMap (1, K, H', W'). Holds the segmentor
    as ``model``."""

    def __init__(self, model, group=None):
        super().__init__()
        self.model = model
        self.group = group

    def preprocess(self, band: torch.Tensor, height: int) -> BandedMap:
        """mmseg's data preprocessor on the band (1, 3, h_r, W) uint8 BGR -> float band."""
        x = self.model.data_preprocessor(dict(inputs=[band[0]]), False)['inputs']
        return BandedMap.from_local(x, height, group=self.group)  # (1, 3, H, W)

    def backbone_feat(self, x: BandedMap) -> tuple:
        """The backbone's bands of its output maps."""
        return self.model.backbone(x)

    def forward(self, band: torch.Tensor, height: int) -> BandedMap:
        return _forward(self.model, self.preprocess(band, height))


# --------------------------------------------------------------------------- inference
def scatter_image(img: Optional[torch.Tensor], hw: Sequence[int], group=None) -> torch.Tensor:
    """Rank 0's image (C, H, W) (None elsewhere) -> this rank's band (C, h_r, W)."""
    rank, size = group_rank_size(group)
    h = int(hw[0])
    layout = Layout([0] + [h] * size, rank)  # rank 0 holds every row
    if rank != 0:
        img = torch.empty(3, 0, int(hw[1]), dtype=torch.uint8)
    return exchange_rows(img, layout, band_bounds(h, size), dim=1, group=group)


def band_labels(logits: BandedMap, hw: Sequence[int], align_corners: bool,
                band: int = 16) -> torch.Tensor:  # fmt: skip
    """This rank's rows of ``resize(logits, hw, bilinear).argmax(1)``: (h_r, W) int64,
    from the logits band; classes in bands of ``band`` with a running first maximum
    (as :func:`mmcirc.apis.highres.upsample_argmax`)."""
    size = (int(hw[0]), int(hw[1]))
    local = logits.local  # (1, K, h'_r, W')
    return banded_argmax(
        (c0, interpolate(
            local[:, c0 : c0 + band].contiguous(), size, None, 'bilinear', align_corners,
            group=logits.group, in_layout=logits.layout,
        )[0])  # (band, h_r, W)
        for c0 in range(0, local.shape[1], band)
    )  # fmt: skip


def predict_sharded(
    sharded: ShardedSegmentor, img, hw: Sequence[int], group=None, logits: bool = False
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The whole-image labels (H, W) int64 on rank 0 (None elsewhere) and, with
    ``logits``, the decode head's whole logits (1, K, H', W') on rank 0.

    img: the image on rank 0 ((H, W, 3) uint8 BGR numpy array or (3, H, W) tensor);
    ignored elsewhere. ``hw``: its size, known to every rank."""
    rank, size = group_rank_size(group)
    check_size(sharded.model, hw, size)  # every rank raises the same one-line error
    t = None
    if rank == 0:
        t = img if isinstance(img, torch.Tensor) else torch.from_numpy(img.transpose(2, 0, 1))
        t = t.contiguous()
    band = scatter_image(t, hw, group)  # (3, h_r, W)
    with torch.no_grad():
        out = sharded(band[None], int(hw[0]))  # (1, K, H', W') banded
        labels = band_labels(out, hw, predict_head(sharded.model).align_corners)
    k = int(out.shape[1])  # labels travel in the smallest integer type that holds them
    small = torch.uint8 if k <= 256 else torch.int32
    rows = Layout.of(int(hw[0]), size, rank)  # the labels' bands: the image's rows
    labels = gather_rows(labels.to(small), rows, dim=0, group=group, dst=0)
    labels = None if labels is None else labels.long()
    whole = gather_rows(out.local, out.layout, dim=-2, group=group, dst=0) if logits else None
    return labels, whole
