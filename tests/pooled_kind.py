"""A fictitious attention kind, ``'pooled'``, added the way a user would, with no edit of
mmcirc (every token attends to the patches with the same weights
``p = softmax_j(mean_c x_j)``, computed in O(N) through ``logsumexp``, times one new
parameter, a per-channel gain initialised to 1; then PVT's / Swin's MLP):

* the operator, ``PooledAttention``, declares its attention itself (``attention_kind``,
  ``attention_form``, ``attention_weights``, and ``flop_handles`` for ``logsumexp``, an
  op mmengine does not price: :mod:`mmcirc.analysis.probes`), so the analysis sees
  it in any model, with nothing registered;
* the block, ``PooledBlock``, is a :class:`~mmcirc.models.blocks.PyramidBlock` with its
  ``kind`` and ``added_keys`` (what a converted checkpoint leaves new);
* a family subclass of CA-PVT / CA-Swin (``PooledPVT``, ``PooledSwin``) adds it to
  ``attention_blocks`` (a kind the family's ``__init__`` does not know gets the
  family's MLP arguments: ``embed_dims``, ``feedforward_channels``, ``drop_rate``,
  ``act_cfg``, ``norm_cfg``, ``ffn_type``; ``block_cfgs`` options add more); registered with
  :func:`mmcirc.registry.register_model` (with the block, for ``block_cfgs`` types), configs
  find it; added to its family with :func:`mmcirc.models.families.register_family`, the
  high-res overrides and the converters find it.

The registrations are undone when :func:`pooled_registered` ends (the registries are
global). Used by tests/models/blocks/test_new_attention_kind.py and
tests/analysis/test_new_attention_kind_analysis.py.
"""

import contextlib
import math
from collections import Counter

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule

from mmcirc.models import families
from mmcirc.models.backbones import CAPVT, CASwin
from mmcirc.models.blocks import PyramidBlock
from mmcirc.models.blocks.pyramid_blocks import build_ffn
from mmcirc.registry import model_registries, register_model

TINY = dict(embed_dims=[8, 16, 24, 32], depths=[1, 2, 1, 1], num_heads=[1, 2, 2, 4])
ORIGINAL = {CAPVT: 'sra', CASwin: 'window'}


def _logsumexp_macs(inputs, outputs):
    """mmengine op handle: one exponential per input element (as a softmax)."""
    return Counter({'logsumexp': math.prod(inputs[0].type().sizes())})


class PooledAttention(nn.Module):
    """y_i = gain * sum_j p_j x_j with p = softmax_j(mean_c x_j): A[i, j] = p_j for every
    query i (rank one), computed in O(N); x (B, N, C) -> (B, N, C).

    It declares its attention (the analysis asks the module): kind ``'pooled'``, its
    matrix (B, 1, N, N) with rows p, and the FLOP handle of ``logsumexp``."""

    attention_kind = 'pooled'
    attention_form = 'matrix'
    flop_handles = {'aten::logsumexp': _logsumexp_macs}

    def __init__(self, embed_dims):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(embed_dims))

    def forward(self, x, hw_shape):
        s = x.mean(-1)  # (B, N)
        p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))  # (B, N)
        return (self.gain * (p.unsqueeze(1) @ x)).expand_as(x)  # (B, 1, C) -> (B, N, C)

    def attention_weights(self, args, kwargs, ctx):
        x, hw = args[0], tuple(int(v) for v in args[1])
        p = torch.softmax(x.mean(-1), -1)  # (B, N)
        return dict(weights=p[:, None, None].expand(-1, 1, x.shape[1], -1), q_grid=hw, k_grid=hw)


class PooledBlock(PyramidBlock, BaseModule):
    """``x + attn(LN(x))``, then the family's MLP; ``attn.gain`` is what is new."""

    kind = 'pooled'
    added_keys = ('attn.',)

    def __init__(
        self,
        embed_dims,
        feedforward_channels,
        drop_rate=0.0,
        drop_path_rate=0.0,
        ffn_type='ffn',
        act_cfg=dict(type='GELU'),
        norm_cfg=dict(type='LN'),
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = PooledAttention(embed_dims)
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.ffn = build_ffn(
            ffn_type, embed_dims, feedforward_channels, drop_rate, drop_path_rate, act_cfg
        )

    def forward(self, x, hw_shape):
        x = x + self.attn(self.norm1(x), hw_shape)
        return self.ffn(self.norm2(x), identity=x)


class PooledPVT(CAPVT):
    """CA-PVT that also takes ``'pooled'`` stages (by default in stages 1-2)."""

    attention_blocks = dict(CAPVT.attention_blocks, pooled=PooledBlock)
    default_attention = 'pooled'


class PooledSwin(CASwin):
    """CA-Swin that also takes ``'pooled'`` stages (by default in stages 1-2)."""

    attention_blocks = dict(CASwin.attention_blocks, pooled=PooledBlock)
    default_attention = 'pooled'


SUBCLASS = {CAPVT: PooledPVT, CASwin: PooledSwin}
REGISTERED = (PooledBlock, PooledPVT, PooledSwin)


@contextlib.contextmanager
def pooled_registered():
    for cls in REGISTERED:
        register_model(cls)
    for cls in SUBCLASS.values():
        families.register_family(cls)
    try:
        yield
    finally:
        for registry in model_registries():
            for cls in REGISTERED:
                registry.module_dict.pop(cls.__name__, None)
        for cls in SUBCLASS.values():
            families.FAMILIES[cls.family].classes.remove(cls)
