"""A built mmseg segmentor turned into its spatially sharded self, and band-wise inference.

:func:`check_shardable` names the first layer sharding does not support (before
anything is allocated); :func:`shard_model` swaps, in place and sharing every weight,
the row-coupled modules of a supported segmentor for their sharded versions
(:mod:`.layers`, :mod:`.backbones`, :mod:`.circulant`, :mod:`.core`) and returns a
:class:`ShardedSegmentor` whose forward maps this rank's band of the image to its band
of the logits. :func:`map_heights` lists the rows of every feature map at an image
size (for :func:`~mmcirc.parallel.bands.check_world_size`); :func:`predict_sharded`
is the inference entry: rank 0's image goes out band by band, every rank predicts its
band of labels (mmseg's bilinear resize of the logits to the image, argmax), rank 0
gets the whole label map and logits back.

Supported: CA-PVT / Core-PVT (any mix of ``'circulant'``, ``'core'``, ``'sra'``
stages) with Semantic FPN (``FPN`` + ``FPNHead``) or ``UPerHead``; CA-DeiT and VECA
with ``MultiLevelNeck`` + ``UPerHead``; ``EncoderDecoder`` segmentors in eval mode.
The backbone's attention, patch and position embeddings are swapped whole
(:func:`_backbone_parts`); every other leaf of the backbone, neck and head goes through
one leaf rule: local (channel-wise, elementwise), swapped (a Conv2d with zero padding,
e.g. PVTv2's depthwise FFN conv, becomes a halo :class:`ShardedConv2d`; GroupNorm;
mmseg ``Upsample``) or refused by name.
"""

import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..utils.labels import banded_argmax
from .bands import band_bounds, check_world_size
from .comm import Layout, exchange_rows, gather_rows, group_rank_size, row_offsets
from .heads import HEAD_FORWARDS, NECK_FORWARDS
from .layers import ShardedConv2d, ShardedGroupNorm, ShardedUpsample, interpolate

__all__ = [
    'check_shardable',
    'map_heights',
    'shard_model',
    'ShardedSegmentor',
    'predict_sharded',
    'SUPPORTED_BACKBONES',
]

SUPPORTED_BACKBONES = ('CAPVT', 'CorePVT', 'CADeiT', 'VECAViT')
_PVT_KINDS = ('circulant', 'core', 'sra')
_INSTEAD = (
    "sharded inference supports CA-PVT / Core-PVT ('circulant', 'core', 'sra' stages) with "
    'Semantic FPN or UperNet, CA-DeiT and VECA with UperNet'
)
#: Leaf modules that are local under sharding (they act on channels or elementwise).
_LOCAL_LEAVES = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.LeakyReLU, nn.Sigmoid, nn.Hardswish, nn.Identity,
    nn.Dropout, nn.Dropout2d, nn.LayerNorm, nn.Linear,
)  # fmt: skip


def _local_leaves() -> tuple:
    """:data:`_LOCAL_LEAVES` and the drop-path layers (identity in eval mode)."""
    from mmcv.cnn.bricks.drop import DropPath

    from mmcirc.models.backbones.ca_deit import DropPath as DeiTDropPath

    return _LOCAL_LEAVES + (DropPath, DeiTDropPath)


def _err(where: str, what: str) -> ValueError:
    return ValueError(f'{where}: {what}; {_INSTEAD}')


# --------------------------------------------------------------------------- checks
def _check_backbone(bb) -> None:
    from mmcirc.models.backbones.pyramid import PyramidBackbone

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
        for i, kind in enumerate(kinds):
            if kind not in _PVT_KINDS:
                raise _err(f'{name} stage {i + 1}', f'attention {kind!r} has no sharded version')
        return
    if name not in SUPPORTED_BACKBONES:
        raise _err(f'backbone {name}', 'not supported')


def _backbone_parts(bb) -> dict:
    """``{path: wrap(module, group) | None}`` (paths as ``bb.named_modules()`` gives
    them): the row-coupled parts of the backbone
    ``bb`` that :func:`shard_model` swaps whole for a sharded wrapper (``None``: the
    sharded backbone forward computes the part itself). Everything else in the backbone
    goes through the leaf rule (:func:`_check_leaves`, :func:`_swap_leaves`)."""
    from mmcirc.models.backbones.pyramid import PyramidBackbone
    from mmcirc.models.blocks import CirculantBlock, CoreBlock, SRABlock
    from .backbones import (
        GlobalShape, ShardedCorePeriphery, ShardedPatchEmbed, ShardedPositionEmbedding,
        ShardedSRA,
    )  # fmt: skip
    from .circulant import ShardedCirculantAttention
    from .core import ShardedCoreAttention

    def circulant(attn, group):
        return GlobalShape(ShardedCirculantAttention.from_module(attn, group), group)

    found = {}  # id(module) -> wrap
    if isinstance(bb, PyramidBackbone):
        for i, stage in enumerate(bb.stages):
            found[id(stage.patch_embed)] = ShardedPatchEmbed
            if stage.pos_embed is not None:
                found[id(stage.pos_embed)] = ShardedPositionEmbedding
            for blk in stage.blocks:
                if isinstance(blk, (CirculantBlock, CoreBlock)) and blk.cpe is not None:
                    found[id(blk.cpe)] = ShardedConv2d
                if isinstance(blk, CirculantBlock):
                    found[id(blk.attn)] = circulant
                elif isinstance(blk, CoreBlock):
                    found[id(blk.attn)] = ShardedCoreAttention.from_module
                elif isinstance(blk, SRABlock):
                    found[id(blk.attn)] = ShardedSRA
    else:
        found[id(bb.patch_embed)] = lambda m, g: ShardedPatchEmbed(m, g, pad_to_stride=True)
        cadeit = type(bb).__name__ == 'CADeiT'
        if not cadeit:
            found[id(bb.rope)] = None  # the patch coordinates of the band's rows: veca_forward
        for blk in bb.blocks:
            if cadeit:
                found[id(blk.cpe)] = ShardedConv2d
            found[id(blk.attn)] = circulant if cadeit else ShardedCorePeriphery
    return {path: found[id(m)] for path, m in bb.named_modules() if id(m) in found}


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r + '.') for r in roots)


def _check_leaves(module, where: str, skip=()) -> None:
    """Every leaf of ``module`` outside the subtrees ``skip`` (paths) is local, swapped
    by :func:`_swap_leaves` (Conv2d with zero padding, GroupNorm, mmseg Upsample) or
    BatchNorm in eval mode; the first one that is not is named in a ValueError."""
    from mmseg.models.utils import Upsample

    skip, local = set(skip), _local_leaves()
    for path, m in module.named_modules():
        if _under(path, skip):
            continue
        if path.split('.')[0] == 'loss_decode' or type(m).__name__.endswith('Loss'):
            continue  # training only
        if type(m).__name__ == 'PPM':
            skip.add(path)
            for branch in m:
                if not isinstance(branch[0], nn.AdaptiveAvgPool2d):
                    raise _err(f'{where}.{path}', 'a PPM branch must start with AdaptiveAvgPool2d')
            continue
        if list(m.children()):
            continue
        full = f'{where}.{path}' if path else where
        if isinstance(m, nn.Conv2d):
            if m.padding_mode != 'zeros' or isinstance(m.padding, str):
                raise _err(full, f'Conv2d padding_mode={m.padding_mode!r} is not supported')
        elif isinstance(m, _BatchNorm):
            if m.training:
                raise _err(full, f'{type(m).__name__} in training mode (call model.eval())')
        elif not isinstance(m, (nn.GroupNorm, Upsample) + local):
            raise _err(full, f'layer {type(m).__name__} has no sharded version')


def check_shardable(model) -> None:
    """Raise a one-line ValueError naming the first part of ``model`` (an mmseg
    segmentor) that sharded inference does not support, and what is."""
    from mmseg.models.segmentors import CascadeEncoderDecoder, EncoderDecoder

    if not isinstance(model, EncoderDecoder) or isinstance(model, CascadeEncoderDecoder):
        raise _err(f'segmentor {type(model).__name__}', 'only EncoderDecoder is supported')
    _check_backbone(model.backbone)
    _check_leaves(model.backbone, 'backbone', skip=_backbone_parts(model.backbone))
    if getattr(model, 'with_neck', False):
        neck = model.neck
        name = type(neck).__name__
        if name not in NECK_FORWARDS:
            raise _err(f'neck {name}', 'not supported')
        if name == 'FPN' and neck.num_outs > len(neck.lateral_convs):
            raise _err('neck FPN', f'extra levels (num_outs={neck.num_outs}) are not supported')
        _check_leaves(neck, 'neck')
    head = model.decode_head
    if type(head).__name__ not in HEAD_FORWARDS:
        raise _err(f'decode_head {type(head).__name__}', 'not supported')
    _check_leaves(head, 'decode_head')
    pre = model.data_preprocessor
    if getattr(pre, 'test_cfg', None) and any(
        pre.test_cfg.get(k) for k in ('size', 'size_divisor')
    ):
        raise _err('data_preprocessor', 'test-time padding (test_cfg size / size_divisor)')


def map_heights(model, hw: Sequence[int]) -> List[int]:
    """Rows of the image and of every feature map of ``model`` at image size ``hw``
    (the backbone stages, the neck levels); the smallest bounds the world size."""
    from mmcirc.models.backbones.pyramid import PyramidBackbone, stride_of

    bb, h = model.backbone, int(hw[0])
    heights = [h]
    if isinstance(bb, PyramidBackbone):
        for stage in bb.stages:
            embed = getattr(stage.patch_embed, 'embed', stage.patch_embed)  # sharded or not
            h = -(-h // stride_of(embed))
            heights.append(h)
        levels = [heights[1 + i] for i in bb.out_indices]
    else:
        h = -(-h // bb.patch_size)
        heights.append(h)
        levels = [h] * len(bb.out_indices)
    neck = getattr(model, 'neck', None) if getattr(model, 'with_neck', False) else None
    if neck is not None and type(neck).__name__ == 'MultiLevelNeck':
        src = levels if len(levels) > 1 else levels * neck.num_outs
        heights += [int(math.floor(s * f)) for s, f in zip(src, neck.scales)]
    return heights


def check_size(model, hw: Sequence[int], world_size: int) -> None:
    """:func:`check_world_size` over :func:`map_heights` at image size ``hw``."""
    check_world_size(map_heights(model, hw), world_size, what=f'{hw[0]}x{hw[1]} image')


# --------------------------------------------------------------------------- swapping
def _swap_leaves(module, group, skip=()) -> None:
    """Conv2d (non-local), GroupNorm and mmseg Upsample -> sharded, in place, outside
    the subtrees ``skip`` (paths) and the PPM branches (they run on the replicated
    pooled maps)."""
    from mmseg.models.utils import Upsample

    skip = set(skip)
    for path, child in list(module.named_modules()):
        if not path or _under(path, skip):
            continue
        if type(child).__name__ == 'PPM':
            skip.add(path)
        elif isinstance(child, nn.Conv2d):
            new = ShardedConv2d(child, group)
            if not new.local:
                module.set_submodule(path, new)
        elif isinstance(child, nn.GroupNorm):
            module.set_submodule(path, ShardedGroupNorm(child, group))
        elif isinstance(child, Upsample):
            module.set_submodule(path, ShardedUpsample(child, group))


def shard_model(model, group=None) -> 'ShardedSegmentor':
    """Swap ``model``'s (an mmseg segmentor, eval mode) row-coupled modules for sharded
    ones in place (weights shared, nothing copied) and return the band-wise
    :class:`ShardedSegmentor`. ValueError (:func:`check_shardable`) before any change."""
    model.eval()
    check_shardable(model)
    bb = model.backbone
    parts = _backbone_parts(bb)
    for path, wrap in parts.items():
        if wrap is not None:
            bb.set_submodule(path, wrap(bb.get_submodule(path), group))
    _swap_leaves(bb, group, skip=parts)  # e.g. PVTv2's depthwise conv in the FFN
    if model.with_neck:
        _swap_leaves(model.neck, group)
    _swap_leaves(model.decode_head, group)
    return ShardedSegmentor(model, group)


class ShardedSegmentor(nn.Module):
    """``forward(band)``: this rank's rows of the image (1, 3, h_r, W) (uint8 BGR, as
    mmseg's data preprocessor takes it) -> its band of the decode head's logits
    (1, K, h'_r, W'). Holds the (swapped) segmentor as ``model``."""

    def __init__(self, model, group=None):
        super().__init__()
        self.model = model
        self.group = group

    def extract_feat(self, x: torch.Tensor) -> tuple:
        """Backbone and neck of the preprocessed band x (1, 3, h_r, W)."""
        m = self.model
        feats = self.backbone_feat(x)
        if m.with_neck:
            feats = NECK_FORWARDS[type(m.neck).__name__](m.neck, feats, self.group)
        return feats

    def backbone_feat(self, x: torch.Tensor) -> tuple:
        """The backbone's bands of its output maps."""
        from mmcirc.models.backbones.pyramid import PyramidBackbone

        from .backbones import veca_forward

        m, g = self.model, self.group
        bb = m.backbone
        if isinstance(bb, PyramidBackbone):
            feats, xh = [], (x, None)
            for i, stage in enumerate(bb.stages):
                x, hw, out, out_hw = stage(*xh)
                xh = (x, hw)
                if i in bb.out_indices:
                    norm = getattr(bb, f'norm{i}', None)
                    out = norm(out) if norm is not None else out
                    b, n, c = out.shape
                    feats.append(out.transpose(1, 2).reshape(b, c, *out_hw).contiguous())
            feats = tuple(feats)
        elif type(bb).__name__ == 'VECAViT':
            feats = veca_forward(bb, x, bb.patch_embed, g)
        else:
            feats = bb(x)
        return feats

    def preprocess(self, band: torch.Tensor) -> torch.Tensor:
        """mmseg's data preprocessor on the band (1, 3, h_r, W) uint8 BGR -> float."""
        return self.model.data_preprocessor(dict(inputs=[band[0]]), False)['inputs']

    def forward(self, band: torch.Tensor) -> torch.Tensor:
        m = self.model
        feats = self.extract_feat(self.preprocess(band))  # band (1, 3, h_r, W)
        return HEAD_FORWARDS[type(m.decode_head).__name__](m.decode_head, feats, self.group)


# --------------------------------------------------------------------------- inference
def scatter_image(img: Optional[torch.Tensor], hw: Sequence[int], group=None) -> torch.Tensor:
    """Rank 0's image (C, H, W) (None elsewhere) -> this rank's band (C, h_r, W)."""
    rank, size = group_rank_size(group)
    h = int(hw[0])
    layout = Layout([0] + [h] * size, rank)  # rank 0 holds every row
    if rank != 0:
        img = torch.empty(3, 0, int(hw[1]), dtype=torch.uint8)
    return exchange_rows(img, layout, band_bounds(h, size), dim=1, group=group)


def band_labels(logits: torch.Tensor, hw: Sequence[int], align_corners: bool, group=None,
                band: int = 16) -> torch.Tensor:  # fmt: skip
    """This rank's rows of ``resize(logits, hw, bilinear).argmax(1)``: (h_r, W) int64,
    from the logits band (1, K, h'_r, W'); classes in bands of ``band`` with a running
    first maximum (as :func:`mmcirc.apis.highres.upsample_argmax`)."""
    (layout,) = row_offsets(logits.shape[-2], group=group)
    out = Layout(
        [b[0] for b in band_bounds(int(hw[0]), layout.world_size)] + [int(hw[0])], layout.rank
    )
    size = (int(hw[0]), int(hw[1]))
    return banded_argmax(
        (c0, interpolate(
            logits[:, c0 : c0 + band].contiguous(), size, None, 'bilinear', align_corners,
            group=group, in_layout=layout, out_layout=out,
        )[0])  # (band, h_r, W)
        for c0 in range(0, logits.shape[1], band)
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
        out = sharded(band[None])  # (1, K, h'_r, W')
        labels = band_labels(out, hw, sharded.model.decode_head.align_corners, group)
    k = int(out.shape[1])  # labels travel in the smallest integer type that holds them
    small = torch.uint8 if k <= 256 else torch.int32
    labels = gather_rows(labels.to(small), dim=0, group=group, dst=0)
    labels = None if labels is None else labels.long()
    whole = gather_rows(out, dim=-2, group=group, dst=0) if logits else None
    return labels, whole
