"""The registered benchmark cases: attention layers, backbones and isotropic models, each
built by its class (random weights, seed 0, nothing downloaded) with size, batch and
depth as arguments; precision, device, eager / compile and forward / backward are the
axes of :func:`mmcirc.benchmark.measurement.make_step`.

* ``attention``: one layer on a (B, H*W, C) token map (C = ``dim``, default 64,
  :data:`ATTENTION_DIM`): ``sdpa`` (:class:`~mmcirc.benchmark.baselines.SDPASelfAttention`,
  heads of 64: at C = 64 PVT stage 1 without the reduction; flash-pinned like the
  plain-attention models), ``circ-circ`` / ``circ-zero``
  (:class:`~mmcirc.ops.CirculantAttention`, d = 1, circular / zero boundary),
  ``circ-linears`` (its gate + qkv + proj Linears alone), ``core-K``
  (:class:`~mmcirc.benchmark.baselines.CoreAttentionWithBank`, 1 head, K cores of 64);
  ``fft`` / ``kernel-ieee`` / ``kernel-tf32``: circulant attention on the FFT path and
  with the Triton kernel of its core (``tl.dot`` in float32 or TF32);
* ``backbone``: mmdet's / mmseg's PVT-S and Swin-T and mmcirc's pyramids (need
  mmdet / mmseg: imported by the builder that needs them);
* ``isotropic``: mmcirc's CA-DeiT / VECA (torch only) and timm's DeiT / ViT
  (``dynamic_img_size``, no classifier; need timm); ``ca_deit_t_triton``: CA-DeiT-T with
  the Triton kernel of the attention core (``kernel='triton'``; on CPU tensors it runs in
  Triton's interpreter, with ``TRITON_INTERPRET=1``).

``CASES[name].build(hw, batch=1, depth=None, device='cpu', dim=64)`` returns ``(model, call, x)``:
``call(x)`` runs the model on its input ``x``. ``baseline`` names the plain-attention
twin a case is compared with; ``flash`` marks the plain-attention models whose SDPA is
pinned to the flash kernel under half precision on CUDA.
"""

import importlib.util
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

__all__ = ['ATTENTION_DIM', 'CASES', 'LAYERS', 'Case', 'case', 'count_macs', 'register_case']

ATTENTION_DIM = 64
CORE_COUNTS = (8, 16, 64)


@dataclass(frozen=True)
class Case:
    """One registered model: see the module docstring."""

    name: str
    group: str
    label: str
    builder: Callable  # (hw, depth, dim) -> (model, call); dim: tokens' channels
    inputs: str = 'image'  # 'image': (B, 3, H, W); 'tokens': (B, H*W, ATTENTION_DIM)
    baseline: Optional[str] = None
    flash: bool = False
    multiple: int = 1  # H and W must be multiples of this

    def build(
        self, hw, batch: int = 1, depth: Optional[int] = None, device='cpu', dim=ATTENTION_DIM
    ) -> Tuple:
        import torch

        hw = (hw, hw) if isinstance(hw, int) else tuple(hw)
        torch.manual_seed(0)
        model, call = self.builder(hw, depth, dim)
        shape = (batch, hw[0] * hw[1], dim) if self.inputs == 'tokens' else (batch, 3, *hw)
        return model.to(device), call, torch.randn(*shape, device=device)


#: name -> :class:`Case`
CASES: Dict[str, Case] = {}


def register_case(name, group, label, builder, **kwargs) -> Case:
    if name in CASES:
        raise ValueError(f'benchmark case {name!r} is registered already')
    CASES[name] = Case(name, group, label, builder, **kwargs)
    return CASES[name]


def case(name: str) -> Case:
    """The registered case ``name``; ValueError naming the registered ones otherwise."""
    if name not in CASES:
        raise ValueError(f'benchmark case must be one of {sorted(CASES)}, got {name!r}')
    return CASES[name]


def _init_weights(model):
    """``init_weights`` with mmengine's per-parameter INFO log silenced (torch only:
    the isotropic models' fallback base class logs nothing)."""
    if importlib.util.find_spec('mmengine') is None:
        model.init_weights()
        return model
    from mmcirc.utils.quiet import quiet_logger

    with quiet_logger():
        model.init_weights()
    return model


def _plain(model):
    return model, model


# ----------------------------------------------------------------------------- attention
def _attention(kind):
    def builder(hw, depth, dim=ATTENTION_DIM):
        from mmcirc import ops
        from mmcirc.benchmark.baselines import CoreAttentionWithBank, SDPASelfAttention

        if kind == 'sdpa':  # heads of 64 (DeiT's; one head at C = 64)
            return _plain(SDPASelfAttention(dim, max(1, dim // ATTENTION_DIM)))
        if kind.startswith('core-'):
            k = int(kind.split('-')[1])
            return _plain(CoreAttentionWithBank(dim, 1, k, bank_size=max(CORE_COUNTS)))
        kernel = 'triton' if kind.startswith('kernel-') else 'torch' if kind == 'fft' else None
        m = ops.CirculantAttention(
            dim, boundary='zero' if kind == 'circ-zero' else 'circular', kernel=kernel
        )
        if kind == 'circ-linears':
            return m, lambda x: (m.proj(m.gate(x)), m.qkv(x))
        if kernel == 'triton':  # tl.dot in float32 ('ieee') or TF32, set at every call
            from mmcirc.ops.settings import set_precision

            precision = kind.split('-')[1]
            return m, lambda x: (set_precision(precision), m(x, hw))[1]
        return m, lambda x: m(x, hw)

    return builder


#: the layers of one attention call on a token map (and ``fft`` / ``kernel-*``, same weights)
LAYERS = ('sdpa', 'circ-circ', 'circ-zero', 'circ-linears', *(f'core-{k}' for k in CORE_COUNTS))
for _kind in LAYERS + ('fft', 'kernel-ieee', 'kernel-tf32'):
    register_case(
        _kind, 'attention', _kind, _attention(_kind), inputs='tokens', flash=_kind == 'sdpa'
    )


# ----------------------------------------------------------------------------- backbones
def _backbone(cls_name, **kwargs):
    """A backbone class of mmcirc, or of mmdet / mmseg (``'mmdet:Class'``)."""

    def builder(hw, depth, dim=None):
        if ':' in cls_name:
            library, name = cls_name.split(':')
            cls = getattr(importlib.import_module(f'{library}.models.backbones'), name)
            return _plain(_init_weights(cls(**kwargs, init_cfg=None)))
        from mmcirc.models import backbones

        return _plain(_init_weights(getattr(backbones, cls_name)(**kwargs)))

    return builder


_S, _T, _PVT = dict(arch='small'), dict(arch='tiny'), dict(num_layers=[3, 4, 6, 3])
_CORE_S = dict(_S, stage_attentions='core')
_S64, _T64 = dict(_S, num_cores=64), dict(_T, num_cores=64)
for _name, _label, _cls, _kw, _baseline in (
    ('pvt_s', 'PVT-S (mmdet)', 'mmdet:PyramidVisionTransformer', _PVT, None),
    ('circ_pvt_s', 'all-circulant PVT-S', 'CAPVT', dict(_S, stage_attentions='circulant'), 'pvt_s'),
    ('core_pvt_s', "all-core PVT-S C'=64", 'CorePVT', dict(_CORE_S, num_cores=64), 'pvt_s'),
    ('core_pvt_s_c8', "all-core PVT-S C'=8", 'CorePVT', dict(_CORE_S, num_cores=8), 'pvt_s'),
    ('ca_pvt_s', 'CA-PVT-S (paper layout)', 'CAPVT', _S, 'pvt_s'),
    ('core_pvt_s_paper', "Core-PVT-S (paper layout) C'=64", 'CorePVT', _S64, 'pvt_s'),
    ('swin_t', 'Swin-T (mmdet)', 'mmdet:SwinTransformer', {}, None),
    ('swin_t_mmseg', 'Swin-T (mmseg)', 'mmseg:SwinTransformer', {}, None),
    ('ca_swin_t', 'CA-Swin-T (paper layout)', 'CASwin', _T, 'swin_t'),
    ('core_swin_t', "Core-Swin-T (paper layout) C'=64", 'CoreSwin', _T64, 'swin_t'),
    ('ca_pvt_t', 'CA-PVT-T', 'CAPVT', _T, None),
    ('core_pvt_t', "Core-PVT-T (C'=64)", 'CorePVT', _T64, None),
):  # fmt: skip
    _builder = _backbone(_cls, **_kw)
    register_case(_name, 'backbone', _label, _builder, baseline=_baseline, multiple=32)


# ----------------------------------------------------------------------------- isotropic
def _timm(arch):
    def builder(hw, depth, dim=None):
        import timm

        extra = {} if depth is None else dict(depth=depth)
        model = timm.create_model(
            arch, pretrained=False, num_classes=0, img_size=224, dynamic_img_size=True, **extra
        )
        return _plain(model)

    return builder


def _isotropic(cls_name, arch, **kwargs):
    def builder(hw, depth, dim=None):
        from mmcirc.models.backbones import CADeiT, VECAViT

        cls = dict(CADeiT=CADeiT, VECAViT=VECAViT)[cls_name]
        depth_key = 'depth' if cls is CADeiT else 'num_layers'
        spec = arch if depth is None else dict(cls.arch_zoo[arch], **{depth_key: depth})
        return _plain(_init_weights(cls(spec, **kwargs)))

    return builder


for _name, _label, _cls, _arch, _kw, _baseline in (
    ('ca_deit_t', 'CA-DeiT-T', 'CADeiT', 'tiny', {}, 'deit_t'),
    ('ca_deit_s', 'CA-DeiT-S', 'CADeiT', 'small', {}, 'deit_s'),
    ('ca_deit_b', 'CA-DeiT-B', 'CADeiT', 'base', {}, 'deit_b'),
    ('ca_deit_t_triton', 'CA-DeiT-T (Triton kernel)', 'CADeiT', 'tiny', {'kernel': 'triton'}, None),
    ('veca_s', 'VECA-S', 'VECAViT', 'small', {}, 'vit_s'),
    ('veca_b', 'VECA-B', 'VECAViT', 'base', {}, 'vit_b'),
):  # fmt: skip
    _builder = _isotropic(_cls, _arch, **_kw)
    register_case(_name, 'isotropic', _label, _builder, baseline=_baseline, multiple=16)
for _name, _arch, _label in (
    ('deit_t', 'deit_tiny_patch16_224', 'DeiT-T'),
    ('deit_s', 'deit_small_patch16_224', 'DeiT-S'),
    ('deit_b', 'deit_base_patch16_224', 'DeiT-B'),
    ('vit_s', 'vit_small_patch16_224', 'ViT-S'),
    ('vit_b', 'vit_base_patch16_224', 'ViT-B'),
):
    register_case(_name, 'isotropic', _label, _timm(_arch), flash=True, multiple=16)


def group(name: str):
    """The names of the cases of one group, in registration order."""
    return [n for n, c in CASES.items() if c.group == name]


def count_macs(name: str, hw, depth: Optional[int] = None, extrapolate: bool = False) -> float:
    """Counted multiply-adds of one forward of case ``name`` at ``hw`` (batch 1,
    ``mmcirc.analysis.count_flops``; the counter executes the model).

    ``extrapolate`` (isotropic models: identical blocks that keep the token count):
    count the models with 1 and 2 blocks and return ``F(1) + (depth - 1) (F(2) -
    F(1))`` for the model's depth (``depth``, else its real one), exact and much cheaper
    than counting the whole model at large sizes."""
    c = case(name)
    if not extrapolate:
        return _count(c, hw, depth)
    if depth is None:
        depth = len(c.builder(hw, None)[0].blocks)
    f1 = _count(c, hw, 1)
    return f1 if depth == 1 else f1 + (depth - 1) * (_count(c, hw, 2) - f1)


def _count(c, hw, depth):
    """Counted multiply-adds of the case's ``call`` on its input (the model in eval mode); a
    call that is not the model's forward is counted as the forward of a module holding it."""
    from torch import nn

    from mmcirc.analysis import count_flops

    model, call, x = c.build(hw, depth=depth)
    model.eval()  # not chained: some train() overrides (mmdet's Swin) return None
    if call is model:
        return count_flops(model, x)
    holder = nn.Module()
    holder.model = model
    return count_flops(holder, x, forward=call)
