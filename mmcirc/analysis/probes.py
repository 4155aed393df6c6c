"""How the analysis sees an attention layer: what its weights are and how they are
recomputed from one call, and how its FLOPs are counted.

:mod:`mmcirc.analysis.attention_maps` (capture) and :mod:`mmcirc.analysis.flops`
(attention FLOPs) know no attention kind themselves: they ask the module. A module
declares its attention in one of two ways.

**On the operator** (a class mmcirc or the user owns), class attributes and a method:

* ``attention_kind`` (str): the kind recorded (e.g. ``'circulant'``); a module whose
  class has one is an attention layer (its FLOPs are attention FLOPs);
* ``attention_form`` (str or None): what :meth:`attention_weights` returns, one of
  :data:`FORMS`; None: not captured (FLOPs only);
* ``attention_weights(self, args, kwargs, ctx) -> dict``: the weights of the call
  ``self(*args, **kwargs)``, recomputed from its inputs and the module's weights
  (see :class:`AttentionProbe.weights`);
* ``flop_handles`` (dict, optional): mmengine op handles (``'aten::op' -> handle``)
  for the aten ops the operator traces to that mmengine does not price (they apply to
  that op wherever it is traced in the model: a convention per op, as in mmengine).

**By a probe** (:class:`AttentionProbe`), for operator classes one cannot edit and for
mmcirc's own operators, added with :func:`register_attention_probe`; those of this
module, in this order: :class:`CirculantProbe`, :class:`CoreProbe`, mmdet's
spatial-reduction (:class:`SRAProbe`) and window attention (:class:`WindowProbe`), then
the dense self-attention of other libraries (:class:`ViTProbe`: mmpretrain's and timm's
ViT, class/register tokens dropped, on the last patch embedding's grid;
:class:`MHAProbe`: torch's and mmcv's multi-head attention anywhere else, FLOPs only),
recognised lazily (a library is never imported here but mmdet);
:func:`attention_probes` lists them all. The blocks do not know their probes.

Forms of the weights (the ``weights`` entry, detached, any leading batch dims B'):

* ``'matrix'``: an attention matrix (B', heads, Nq, Nk) from the queries on the
  ``q_grid`` (Hq, Wq) to the keys on the ``k_grid`` (Hk, Wk), tokens row-major; rows
  are distributions over the keys. BCCB-scorable (:mod:`mmcirc.analysis.bccb`).
* ``'kernel'``: a circulant kernel (B, heads, Kh, Kw), ``A[i, j] = p[j (-) i]``, with
  ``boundary`` (extra entry) ``'circular'`` (Kh x Kw = the map, wrapped offsets) or
  ``'zero'`` ((2H-1) x (2W-1), ordered by offset); ``q_grid = k_grid`` = (H, W).
* ``'gather'``: gather weights (B, heads, C', N) of C' cores over the N patches of the
  ``q_grid``; each row a distribution over the patches.

"""

import functools
import importlib
import math
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmdet.models.backbones.pvt import SpatialReductionAttention
from mmdet.models.backbones.swin import WindowMSA
from torch import nn

from mmcirc.ops.circulant import CirculantAttention
from mmcirc.ops.circulant_functional import attention_kernel
from mmcirc.ops.core import CoreAttention

__all__ = [
    'FORMS',
    'AttentionProbe',
    'CirculantProbe',
    'CoreProbe',
    'SRAProbe',
    'WindowProbe',
    'ViTProbe',
    'MHAProbe',
    'mha_weights',
    'patch_grid',
    'attention_probes',
    'register_attention_probe',
    'probe_of',
    'declared_kind',
    'lazy_classes',
    'call_arg',
]

#: What a captured weight tensor is (see the module docstring).
FORMS = ('matrix', 'kernel', 'gather')


def lazy_classes(path: str, names: Sequence[str]) -> tuple:
    """Classes ``names`` of module ``path`` if its library is already imported (a model
    built from them has imported it); never imports a library itself."""
    if path.split('.')[0] not in sys.modules:
        return ()
    try:
        module = importlib.import_module(path)
    except Exception:  # noqa: BLE001  (broken install: recognise by attributes)
        return ()
    return tuple(getattr(module, n) for n in names if hasattr(module, n))


def call_arg(args, kwargs, index: int, name: str, default=None):
    """Argument ``name`` (position ``index``) of a forward call."""
    return args[index] if len(args) > index else kwargs.get(name, default)


class AttentionProbe:
    """How the analysis sees the attention layers of some operator classes.

    Subclasses set :attr:`kind` and :attr:`form` and implement :meth:`matches` and
    :meth:`weights`; :meth:`observe` and :attr:`flop_handles` are optional.
    """

    #: the kind recorded for the layers this probe matches
    kind: str = ''
    #: one of :data:`FORMS`, or None: the layer is attention for the FLOP count only
    form: Optional[str] = None
    #: mmengine op handles the operator needs (see the module docstring)
    flop_handles: Dict[str, Callable] = {}

    def matches(self, module: nn.Module) -> bool:
        """Whether ``module`` is a layer of this kind."""
        raise NotImplementedError

    def weights(self, module: nn.Module, args: tuple, kwargs: dict, ctx) -> dict:
        """The weights of the call ``module(*args, **kwargs)``, recomputed (no grad).

        ``ctx`` holds ``hw_shape``: the (H, W) the enclosing block was called with
        (None if unseen), and what :meth:`observe` hooks wrote (e.g. ``patch_grid``).
        Returns ``dict(weights=..., q_grid=..., k_grid=..., **extra)``; a None grid is
        the enclosing block's ``hw_shape``; the other entries are kept as metadata.
        """
        raise NotImplementedError

    def observe(self, model: nn.Module, ctx) -> List[Tuple[nn.Module, Callable]]:
        """Forward hooks ``(module, hook(module, inputs, output))`` the capture adds to
        ``model`` while this probe has layers in it (they may write to ``ctx``)."""
        return []


class _Declared(AttentionProbe):
    """The probe of an operator that declares its attention itself."""

    def __init__(self, cls):
        self.kind = cls.attention_kind
        self.form = getattr(cls, 'attention_form', None)
        self.flop_handles = dict(getattr(cls, 'flop_handles', {}) or {})
        self._cls = cls

    def matches(self, module):
        return type(module) is self._cls

    def weights(self, module, args, kwargs, ctx):
        return module.attention_weights(args, kwargs, ctx)


#: every registered probe (:func:`register_attention_probe`)
_EXTRA: List[AttentionProbe] = []


def register_attention_probe(probe: AttentionProbe) -> AttentionProbe:
    """Add a probe to :func:`attention_probes` (returns it)."""
    if not isinstance(probe, AttentionProbe) or not probe.kind:
        raise TypeError(f'probe must be an AttentionProbe with a kind, got {probe!r}')
    if probe.form is not None and probe.form not in FORMS:
        raise ValueError(f'{type(probe).__name__}.form must be one of {FORMS} or None')
    _EXTRA.append(probe)
    return probe


def attention_probes() -> List[AttentionProbe]:
    """The registered probes, in registration order: those of mmcirc's operators and of
    mmdet's PVT and Swin attention, those of other libraries' dense attention and any
    added with :func:`register_attention_probe`."""
    return list(_EXTRA)


def declared_kind(module: nn.Module) -> Optional[str]:
    """``attention_kind`` of the module's class, if it declares one."""
    kind = getattr(type(module), 'attention_kind', None)
    return kind if isinstance(kind, str) and kind else None


def probe_of(
    module: nn.Module, probes: Optional[Sequence[AttentionProbe]] = None
) -> Optional[AttentionProbe]:
    """The probe of ``module``: its own declaration, else the first of ``probes``
    (default :func:`attention_probes`) that matches it; None: not an attention layer."""
    if declared_kind(module) is not None:
        return _Declared(type(module))
    for probe in attention_probes() if probes is None else probes:
        if probe.matches(module):
            return probe
    return None


class CirculantProbe(AttentionProbe):
    """:class:`~mmcirc.ops.circulant.CirculantAttention` (any block): the per-head kernel
    ``p = softmax(a)`` over the offsets, ``a[m] = s sum_i q_i . k_{i (+) m}``, with its
    ``boundary``."""

    kind = 'circulant'
    form = 'kernel'

    def matches(self, module):
        return isinstance(module, CirculantAttention)

    def weights(self, mod, args, kwargs, ctx):
        x, hw = call_arg(args, kwargs, 0, 'x'), call_arg(args, kwargs, 1, 'hw_shape')
        h, w = (int(v) for v in hw)
        p = attention_kernel(mod, x, (h, w))  # (B, heads, *grid), the operator's own body
        return dict(weights=p, q_grid=(h, w), k_grid=(h, w), boundary=mod.boundary)


class CoreProbe(AttentionProbe):
    """:class:`~mmcirc.ops.core.CoreAttention`: the gather weights of each core over the
    patches ``softmax((c W_qc)_h (x W_kp)_h^T / sqrt(d))``, on the enclosing block's grid."""

    kind = 'core'
    form = 'gather'

    def matches(self, module):
        return isinstance(module, CoreAttention)

    def weights(self, mod, args, kwargs, ctx):
        x, cores = call_arg(args, kwargs, 0, 'x'), call_arg(args, kwargs, 1, 'cores')
        q = mod.split_heads(mod.q_core(cores)) * mod.scale  # (B, h, C', d)
        k = mod.split_heads(mod.k_patch(x))  # (B, h, N, d)
        gather = torch.softmax(q @ k.transpose(-1, -2), dim=-1)  # (B, h, C', N)
        return dict(weights=gather, q_grid=None, k_grid=None)


def mha_weights(mha: nn.MultiheadAttention, query, key) -> torch.Tensor:
    """Per-head weights of a torch ``nn.MultiheadAttention`` (batch-first inputs
    (B, Lq, C) and (B, Lk, C)): softmax(q k^T / sqrt(head_dim)), (B, heads, Lq, Lk)."""
    if mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError('nn.MultiheadAttention with bias_k/add_zero_attn is not supported')
    c, h = mha.embed_dim, mha.num_heads
    bias = mha.in_proj_bias
    if mha._qkv_same_embed_dim:
        wq, wk = mha.in_proj_weight[:c], mha.in_proj_weight[c : 2 * c]
    else:
        wq, wk = mha.q_proj_weight, mha.k_proj_weight
    bq, bk = (None, None) if bias is None else (bias[:c], bias[c : 2 * c])
    q = F.linear(query, wq, bq).unflatten(-1, (h, c // h)).transpose(1, 2)  # (B, h, Lq, d)
    k = F.linear(key, wk, bk).unflatten(-1, (h, c // h)).transpose(1, 2)  # (B, h, Lk, d)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // h), dim=-1)


class SRAProbe(AttentionProbe):
    """Spatial-reduction attention: mmdet's ``SpatialReductionAttention`` (PVT v1/v2,
    the ``'sra'`` stages) and any module with an ``sr_ratio`` and an
    ``nn.MultiheadAttention`` ``attn`` (mmseg's SegFormer attention); the key grid is the
    spatial-reduction conv's output."""

    kind = 'sra'
    form = 'matrix'

    def matches(self, m):
        return isinstance(m, SpatialReductionAttention) or (
            hasattr(m, 'sr_ratio') and isinstance(getattr(m, 'attn', None), nn.MultiheadAttention)
        )

    def weights(self, mod, args, kwargs, ctx):
        x, hw = call_arg(args, kwargs, 0, 'x'), call_arg(args, kwargs, 1, 'hw_shape')
        hw = tuple(int(v) for v in hw)
        b, n, c = x.shape
        kv, k_grid = x, hw
        if getattr(mod, 'sr_ratio', 1) > 1:
            kv = mod.sr(x.transpose(1, 2).reshape(b, c, *hw))  # (B, C, Hk, Wk)
            k_grid = tuple(int(v) for v in kv.shape[-2:])
            kv = mod.norm(kv.flatten(2).transpose(1, 2))  # (B, Nk, C)
        return dict(weights=mha_weights(mod.attn, x, kv), q_grid=hw, k_grid=k_grid)


class WindowProbe(AttentionProbe):
    """Swin's ``WindowMSA`` (mmdet, mmseg, mmpretrain; the ``'window'`` stages) with its
    relative position bias and shift mask, (B*windows, heads, N, N) on the window grid."""

    kind = 'window'
    form = 'matrix'

    def matches(self, m):
        copies = lazy_classes('mmseg.models.backbones.swin', ['WindowMSA'])  # same math
        copies += lazy_classes('mmpretrain.models.utils.attention', ['WindowMSA'])  # not V2
        return isinstance(m, (WindowMSA, *copies))

    def weights(self, mod, args, kwargs, ctx):
        x, mask = call_arg(args, kwargs, 0, 'x'), call_arg(args, kwargs, 1, 'mask')
        bw, n, c = x.shape
        h = mod.num_heads
        qkv = mod.qkv(x).reshape(bw, n, 3, h, c // h).permute(2, 0, 3, 1, 4)
        q, k = qkv[0] * mod.scale, qkv[1]  # (B*nW, h, N, d)
        attn = q @ k.transpose(-2, -1)  # (B*nW, h, N, N)
        bias = mod.relative_position_bias_table[mod.relative_position_index.view(-1)]
        attn = attn + bias.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = (attn.view(bw // nw, nw, h, n, n) + mask[None, :, None]).view(bw, h, n, n)
        ws = mod.window_size
        ws = (ws, ws) if isinstance(ws, int) else tuple(int(v) for v in ws)
        return dict(weights=torch.softmax(attn, dim=-1), q_grid=ws, k_grid=ws)


#: (module, class) of the patch embeddings whose output grid a ViT's tokens lie on
_PATCH_EMBEDS = (
    ('mmcv.cnn.bricks.transformer', 'PatchEmbed'),  # mmpretrain's ViT / DeiT
    ('mmpretrain.models.utils.embed', 'PatchEmbed'),
    ('mmseg.models.utils.embed', 'PatchEmbed'),
    ('mmdet.models.layers.transformer.utils', 'PatchEmbed'),
    ('timm.layers', 'PatchEmbed'),  # and its subclasses
)


def _patch_embed_classes() -> tuple:
    return sum((lazy_classes(path, [name]) for path, name in _PATCH_EMBEDS), ())


def patch_grid(m: nn.Module, inputs, output) -> Optional[Tuple[int, int]]:
    """Token grid produced by a patch embedding (mmcv/mmpretrain: (x, hw); timm: x)."""
    if isinstance(output, (tuple, list)) and len(output) == 2:
        if isinstance(output[1], (tuple, list)):
            return tuple(int(v) for v in output[1])
    if isinstance(output, torch.Tensor) and output.dim() == 4:  # timm NHWC output
        return int(output.shape[1]), int(output.shape[2])
    x = inputs[0] if inputs else None
    if isinstance(x, torch.Tensor) and x.dim() == 4 and hasattr(m, 'dynamic_feat_size'):
        return tuple(int(v) for v in m.dynamic_feat_size(tuple(x.shape[-2:])))
    grid = getattr(m, 'grid_size', None)
    return tuple(int(v) for v in grid) if grid is not None else None


class ViTProbe(AttentionProbe):
    """Plain self-attention x (B, N, C) with a fused qkv (mmpretrain / timm): exact
    classes only (subclasses may change the math)."""

    kind = 'vit'
    form = 'matrix'

    def matches(self, m):
        cls = lazy_classes('mmpretrain.models.utils.attention', ['MultiheadAttention'])
        cls += lazy_classes('timm.layers', ['Attention'])
        return bool(cls) and type(m) in cls

    def observe(self, model, ctx):
        def hook(m, inputs, output):
            grid = patch_grid(m, inputs, output)
            if grid is not None:
                ctx.patch_grid = grid

        classes = _patch_embed_classes()
        return [(m, hook) for m in model.modules() if classes and isinstance(m, classes)]

    def weights(self, mod, args, kwargs, ctx):
        x = call_arg(args, kwargs, 0, 'x')
        b, n, c = x.shape
        h = mod.num_heads
        qkv = mod.qkv(x).reshape(b, n, 3, h, -1).permute(2, 0, 3, 1, 4)
        q, k = qkv[0], qkv[1]  # (B, h, N, d)
        q = (getattr(mod, 'q_norm', None) or nn.Identity())(q)  # timm's qk_norm
        k = (getattr(mod, 'k_norm', None) or nn.Identity())(k)
        sdpa = getattr(mod, 'scaled_dot_product_attention', None)
        if isinstance(sdpa, functools.partial) and sdpa.keywords.get('scale'):
            scale = 1.0 / sdpa.keywords['scale']  # mmpretrain's qk_scale path divides by it
        else:
            scale = getattr(mod, 'scale', None) or q.shape[-1] ** -0.5
        attn = (q * scale) @ k.transpose(-2, -1)  # (B, h, N, N)
        mask = call_arg(args, kwargs, 1, 'attn_mask')  # timm
        if mask is not None:
            attn = (
                attn.masked_fill(~mask, float('-inf')) if mask.dtype == torch.bool else attn + mask
            )
        attn = torch.softmax(attn, dim=-1)
        grid = getattr(ctx, 'patch_grid', None)
        if grid is None:
            raise ValueError(
                f'{type(mod).__name__}: no patch grid seen before this attention '
                f'(N={n}); the model needs a patch embedding module'
            )
        extra = n - grid[0] * grid[1]
        if extra < 0:
            raise ValueError(
                f'{type(mod).__name__}: {n} tokens but a {grid[0]}x{grid[1]} patch grid'
            )
        return dict(weights=attn[..., extra:, extra:], q_grid=grid, k_grid=grid)


class MHAProbe(AttentionProbe):
    """torch's / mmcv's multi-head attention outside any other attention layer."""

    kind = 'mha'
    form = None

    def matches(self, m):
        cls = lazy_classes('mmcv.cnn.bricks.transformer', ['MultiheadAttention'])
        return isinstance(m, nn.MultiheadAttention) or bool(cls) and isinstance(m, cls)


for _probe in (CirculantProbe(), CoreProbe(), SRAProbe(), WindowProbe(), ViTProbe(), MHAProbe()):
    register_attention_probe(_probe)
