"""ViTDet's simple feature pyramid (Li et al., "Exploring Plain Vision Transformer
Backbones for Object Detection", ECCV 2022, Sec. 3) for isotropic backbones.

mmdet 3.3's pip package has no such neck (ViTDet lives in mmdet's ``projects/``), so
mmcirc registers its own, :class:`SimpleFeaturePyramid`. From the last map of a plain
ViT (stride ``s``, 16 for CA-DeiT / VECA) it builds maps at the strides ``s / scale``
for ``scale`` in ``scale_factors`` (default 4, 2, 1, 0.5: strides 4, 8, 16, 32):

* x4: deconv 2x2/2 -> LN -> GELU -> deconv 2x2/2;  x2: deconv 2x2/2;
  x1: identity;  x0.5: max pool 2x2/2;
* then per level a 1x1 conv (-> ``out_channels``) + LN and a 3x3 conv + LN (no bias);
* ``num_outs`` beyond the built levels: max pool (kernel 1, stride 2) of the last one
  (P6 for the RPN, as ViTDet and mmdet's FPN do).

LN is a channel LayerNorm on (B, C, H, W) maps (:class:`LayerNorm2d`).
"""

from typing import Sequence

import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import nn

from mmcirc.registry import register_model

__all__ = ['SimpleFeaturePyramid', 'LayerNorm2d']


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@register_model()
class SimpleFeaturePyramid(BaseModule):
    """ViTDet simple feature pyramid from one stride-``s`` map.

    Args:
        in_channels (int | Sequence[int]): channels of the backbone output (a
            sequence: the last entry is used, the backbone's last out index).
        out_channels (int): channels of every level (256).
        scale_factors (Sequence[float]): upsampling factors, each in (4, 2, 1, 0.5).
        num_outs (int): levels returned (>= len(scale_factors); extra ones by max pool).
        init_cfg (dict, optional): mmengine init config.
    """

    SCALES = (4.0, 2.0, 1.0, 0.5)

    def __init__(
        self,
        in_channels,
        out_channels: int = 256,
        scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
        num_outs: int = 5,
        init_cfg=dict(type='Xavier', layer=['Conv2d', 'ConvTranspose2d'], distribution='uniform'),
    ):
        super().__init__(init_cfg=init_cfg)
        if isinstance(in_channels, (list, tuple)):
            in_channels = in_channels[-1]
        if not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(
                f'SimpleFeaturePyramid: in_channels must be a positive int, got {in_channels!r}'
            )
        scale_factors = tuple(float(s) for s in scale_factors)
        if not scale_factors or any(s not in self.SCALES for s in scale_factors):
            raise ValueError(
                f'SimpleFeaturePyramid: scale_factors must be taken from {self.SCALES}, '
                f'got {scale_factors!r}'
            )
        if not isinstance(num_outs, int) or num_outs < len(scale_factors):
            raise ValueError(
                f'SimpleFeaturePyramid: num_outs must be an int >= {len(scale_factors)} '
                f'(one per scale factor), got {num_outs!r}'
            )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.scale_factors, self.num_outs = scale_factors, num_outs
        c = in_channels
        self.stages = nn.ModuleList()
        for scale in scale_factors:
            if scale == 4.0:
                layers = [
                    nn.ConvTranspose2d(c, c // 2, 2, stride=2),
                    LayerNorm2d(c // 2, eps=1e-6),
                    nn.GELU(),
                    nn.ConvTranspose2d(c // 2, c // 4, 2, stride=2),
                ]
                width = c // 4
            elif scale == 2.0:
                layers, width = [nn.ConvTranspose2d(c, c // 2, 2, stride=2)], c // 2
            elif scale == 1.0:
                layers, width = [], c
            else:
                layers, width = [nn.MaxPool2d(2, stride=2)], c
            layers += [
                nn.Conv2d(width, out_channels, 1, bias=False),
                LayerNorm2d(out_channels, eps=1e-6),
                nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                LayerNorm2d(out_channels, eps=1e-6),
            ]
            self.stages.append(nn.Sequential(*layers))

    def forward(self, inputs) -> tuple:
        """inputs: a (B, C, H, W) map or a tuple of them (the last is used).
        Returns ``num_outs`` maps, finest first."""
        x = inputs[-1] if isinstance(inputs, (list, tuple)) else inputs
        outs = [stage(x) for stage in self.stages]
        order = sorted(range(len(outs)), key=lambda i: -self.scale_factors[i])  # finest first
        outs = [outs[i] for i in order]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        return tuple(outs)
