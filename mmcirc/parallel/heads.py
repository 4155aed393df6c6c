"""Sharded forwards of mmseg's necks and decode heads: the same dataflow as mmseg 1.2's
``forward`` on band-sharded maps, with its ``resize`` calls (whose target sizes are
the global ones) done by :func:`mmcirc.parallel.layers.resize_like` /
:func:`~mmcirc.parallel.layers.interpolate`. Their convolutions, GroupNorms and
``Upsample`` modules are swapped for the sharded ones by
:func:`mmcirc.parallel.model.shard_model` before these run.

* :func:`fpn_forward` (``FPN``, no extra levels), :func:`multilevel_neck_forward`
  (``MultiLevelNeck``: bilinear resize by scale factor);
* :func:`fpn_head_forward` (``FPNHead``, Semantic FPN), :func:`uper_head_forward`
  (``UPerHead``) with :func:`ppm_forward` (the pyramid pooling: adaptive average pools
  by ``all_reduce``, their 1 x 1 ConvModules on the small replicated maps, the
  bilinear resize back to the band).
"""

import torch

from .comm import row_offsets
from .layers import adaptive_avg_pool, interpolate, interpolate_full, resize_like

__all__ = [
    'fpn_forward',
    'multilevel_neck_forward',
    'fpn_head_forward',
    'uper_head_forward',
    'ppm_forward',
    'NECK_FORWARDS',
    'HEAD_FORWARDS',
]


def _transform_inputs(head, inputs, group):
    if head.input_transform == 'resize_concat':
        inputs = [inputs[i] for i in head.in_index]
        ups = [resize_like(x, inputs[0], 'bilinear', head.align_corners, group) for x in inputs]
        return torch.cat(ups, dim=1)
    if head.input_transform == 'multiple_select':
        return [inputs[i] for i in head.in_index]
    return inputs[head.in_index]


def fpn_forward(neck, inputs, group=None):
    """mmseg ``FPN.forward`` on bands (levels above the inputs are refused earlier)."""
    laterals = [conv(inputs[i + neck.start_level]) for i, conv in enumerate(neck.lateral_convs)]
    cfg = dict(neck.upsample_cfg)
    mode, ac = cfg.pop('mode', 'nearest'), cfg.pop('align_corners', None)
    scale = cfg.pop('scale_factor', None)
    for i in range(len(laterals) - 1, 0, -1):
        if scale is not None:
            up = interpolate(laterals[i], None, scale, mode, ac, group=group)
        else:
            up = resize_like(laterals[i], laterals[i - 1], mode, ac, group)
        laterals[i - 1] = laterals[i - 1] + up
    return tuple(neck.fpn_convs[i](laterals[i]) for i in range(len(laterals)))


def multilevel_neck_forward(neck, inputs, group=None):
    """mmseg ``MultiLevelNeck.forward`` on bands (bilinear, scale factors)."""
    inputs = [conv(inputs[i]) for i, conv in enumerate(neck.lateral_convs)]
    if len(inputs) == 1:
        inputs = [inputs[0] for _ in range(neck.num_outs)]
    outs = []
    for i in range(neck.num_outs):
        x = interpolate(inputs[i], None, neck.scales[i], 'bilinear', None, group=group)
        outs.append(neck.convs[i](x))
    return tuple(outs)


def fpn_head_forward(head, inputs, group=None):
    """mmseg ``FPNHead.forward`` on bands -> the band of the logits."""
    x = _transform_inputs(head, inputs, group)
    output = head.scale_heads[0](x[0])
    for i in range(1, len(head.feature_strides)):
        y = head.scale_heads[i](x[i])
        output = output + resize_like(y, output, 'bilinear', head.align_corners, group)
    return head.cls_seg(output)


def ppm_forward(ppm, x, group=None):
    """mmseg ``PPM.forward`` on a band: each branch's adaptive pool (``all_reduce``) and
    its ConvModule (on the replicated pooled map), then the band of the bilinear resize
    to the input's global size."""
    (layout,) = row_offsets(x.shape[-2], group=group)
    outs = []
    for branch in ppm:
        pool, rest = branch[0], branch[1:]
        pooled = adaptive_avg_pool(x, pool.output_size, group=group)  # (B, C, s, s) whole
        y = rest(pooled)
        outs.append(interpolate_full(y, layout, x.shape[-1], 'bilinear', ppm.align_corners))
    return outs


def uper_head_forward(head, inputs, group=None):
    """mmseg ``UPerHead.forward`` on bands -> the band of the logits."""
    inputs = _transform_inputs(head, inputs, group)
    laterals = [conv(inputs[i]) for i, conv in enumerate(head.lateral_convs)]
    top = inputs[-1]
    psp = torch.cat([top] + ppm_forward(head.psp_modules, top, group), dim=1)
    laterals.append(head.bottleneck(psp))
    levels = len(laterals)
    for i in range(levels - 1, 0, -1):
        up = resize_like(laterals[i], laterals[i - 1], 'bilinear', head.align_corners, group)
        laterals[i - 1] = laterals[i - 1] + up
    fpn_outs = [head.fpn_convs[i](laterals[i]) for i in range(levels - 1)]
    fpn_outs.append(laterals[-1])
    for i in range(levels - 1, 0, -1):
        fpn_outs[i] = resize_like(fpn_outs[i], fpn_outs[0], 'bilinear', head.align_corners, group)
    return head.cls_seg(head.fpn_bottleneck(torch.cat(fpn_outs, dim=1)))


#: mmseg class name -> sharded forward(module, inputs, group).
NECK_FORWARDS = {'FPN': fpn_forward, 'MultiLevelNeck': multilevel_neck_forward}
HEAD_FORWARDS = {'FPNHead': fpn_head_forward, 'UPerHead': uper_head_forward}
