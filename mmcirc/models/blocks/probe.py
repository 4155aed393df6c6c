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

**By a probe** (:class:`AttentionProbe`), for operator classes one cannot edit (mmdet's
spatial-reduction attention, Swin's window attention, a ViT's self-attention) and for
mmcirc's own operators: each is added with :func:`register_attention_probe` where it is
defined (:class:`CirculantProbe`, :class:`CoreProbe` here, mmdet's layers' beside their
blocks); :func:`attention_probes` lists them all.

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

import importlib
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from mmcirc.ops.circulant import CirculantAttention
from mmcirc.ops.circulant_functional import attention_kernel
from mmcirc.ops.core import CoreAttention

__all__ = [
    'FORMS',
    'AttentionProbe',
    'CirculantProbe',
    'CoreProbe',
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
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


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
    mmdet's PVT and Swin attention (registered where they are defined), those of other
    libraries' dense attention (:mod:`.dense_probes`) and any added with
    :func:`register_attention_probe`."""
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
    ``p = softmax(a)`` over the offsets, ``a[m] = s sum_i q_i . k_{i (+) m}``, form
    ``'kernel'`` (B, heads, H, W) by wrapped offset (``'zero'``: (B, heads, 2H-1, 2W-1)
    ordered by offset, ``m + (H-1, W-1)``), with its ``boundary``."""

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
    patches ``softmax((c W_qc)_h (x W_kp)_h^T / sqrt(d))``, form ``'gather'``
    (B, heads, C', N); the patch grid is the enclosing block's ``hw_shape``."""

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


register_attention_probe(CirculantProbe())
register_attention_probe(CoreProbe())
