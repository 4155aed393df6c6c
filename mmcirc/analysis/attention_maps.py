"""Hook-based capture of the attention matrices (or kernels, or gather weights) a model
really uses (their BCCB projection: :mod:`mmcirc.analysis.bccb`).

:class:`AttentionCapture` registers forward hooks (no edit of any library) on every
attention layer of a model and, inside the hook, recomputes the layer's weights from
the call's inputs and the layer's own weights. Which modules are attention layers, how
their weights are recomputed and what they are (their ``form``), this file does not
know: it asks each module for its probe (:mod:`mmcirc.analysis.probes`), so a new
attention kind is seen here as soon as its operator declares itself.
"""

import types
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .probes import FORMS, attention_probes, probe_of

__all__ = ['AttentionRecord', 'AttentionCapture', 'attention_kinds_in', 'find_attention_layers']


def _layers(model: nn.Module):
    """``[(name, probe, module)]`` of every attention layer (own declaration or probe)."""
    probes = attention_probes()
    found = ((name, probe_of(m, probes), m) for name, m in model.named_modules())
    return [entry for entry in found if entry[1] is not None]


def attention_kinds_in(model: Optional[nn.Module] = None) -> Tuple[str, ...]:
    """The kinds the capture knows: those of the registered probes, and those the
    operators in ``model`` declare themselves."""
    kinds = [p.kind for p in attention_probes()]
    if model is not None:
        kinds += [p.kind for _, p, _ in _layers(model)]
    return tuple(dict.fromkeys(kinds))


def _select(model, kinds, forms):
    forms = FORMS if forms is None else forms
    if any(f not in FORMS for f in forms):
        raise ValueError(f'forms must be a subset of {FORMS}, got {tuple(forms)!r}')
    layers = _layers(model)
    if kinds is not None:
        known = attention_kinds_in(model)
        if isinstance(kinds, str) or any(k not in known for k in kinds):
            raise ValueError(f'kinds must be a subset of {known}, got {kinds!r}')
        layers = [entry for entry in layers if entry[1].kind in kinds]
    return [entry for entry in layers if entry[1].form in forms]


def find_attention_layers(
    model: nn.Module, kinds: Optional[Sequence[str]] = None, forms: Optional[Sequence[str]] = None
) -> List[Tuple[str, str, nn.Module]]:
    """``[(name, kind, module)]`` of the capturable attention layers, in model order.

    Args:
        kinds (Sequence[str], optional): only these kinds (ValueError for a kind no
            probe and no operator in ``model`` declares). None: all.
        forms (Sequence[str], optional): only layers whose weights are of these forms
            (``'matrix'``, ``'kernel'``, ``'gather'``). None: all three.
    """
    return [(name, probe.kind, m) for name, probe, m in _select(model, kinds, forms)]


@dataclass
class AttentionRecord:
    """One call of one attention layer: ``weights`` (detached, float32 unless the model
    runs in float64) of the probe's ``form`` (:mod:`mmcirc.analysis.probes`; ``'window'``:
    B' = B * windows; ``'gather'``: the patch grid in ``q_grid`` when the surrounding
    block passed ``hw_shape``, else None), the probe's other entries in ``extra``."""

    name: str
    kind: str
    weights: torch.Tensor
    q_grid: Optional[Tuple[int, int]]
    k_grid: Optional[Tuple[int, int]]
    call: int = 0
    extra: Dict[str, object] = field(default_factory=dict)
    form: str = 'matrix'


def _hw(value) -> Optional[Tuple[int, int]]:
    """(H, W) of an ``hw_shape`` argument, else None."""
    if isinstance(value, (tuple, list, torch.Size)) and len(value) == 2:
        try:
            return tuple(int(v) for v in value)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


class AttentionCapture:
    """Context manager that records the attention of every attention layer.

    Example::

        with AttentionCapture(model, forms=('matrix',)) as cap:
            model.backbone(img)
        for rec in cap.records: ...

    Args:
        model (nn.Module): any model; layers are found by :func:`find_attention_layers`.
        kinds (Sequence[str], optional): which kinds to capture (default: all).
        callback (callable, optional): ``callback(record)`` after each capture (e.g. to
            reduce a large matrix at once); its return value replaces the record in
            :attr:`records` (return None to keep nothing).
        forms (Sequence[str], optional): which forms of weights to capture (default: all).
    """

    def __init__(
        self,
        model: nn.Module,
        kinds: Optional[Sequence[str]] = None,
        callback: Optional[Callable[[AttentionRecord], Optional[AttentionRecord]]] = None,
        forms: Optional[Sequence[str]] = None,
    ):
        self.model = model
        self._selected = _select(model, kinds, forms)
        self.callback = callback
        self.records: List[AttentionRecord] = []
        self._handles = []
        self._shared = types.SimpleNamespace()  # what the probes' observers write
        self._hw = {}  # layer name -> hw_shape of the enclosing block's call
        self._calls = {}

    def __enter__(self):
        for probe in dict.fromkeys(probe for _, probe, _ in self._selected):  # each once
            for m, hook in probe.observe(self.model, self._shared):
                self._handles.append(m.register_forward_hook(hook))
        for name, probe, m in self._selected:
            self._handles.append(
                m.register_forward_hook(self._make_hook(name, probe), with_kwargs=True)
            )
            self._hook_parent(name)
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def _hook_parent(self, name):
        """Record hw_shape of the block that calls a layer (``blk(x, hw_shape, ...)``)."""
        if '.' not in name:
            return
        parent = self.model.get_submodule(name.rsplit('.', 1)[0])

        def pre(_, args, kwargs):
            hw = _hw(args[1] if len(args) > 1 else kwargs.get('hw_shape'))
            if hw is not None:
                self._hw[name] = hw

        self._handles.append(parent.register_forward_pre_hook(pre, with_kwargs=True))

    def _make_hook(self, name, probe):
        def hook(m, args, kwargs, output):
            ctx = types.SimpleNamespace(**vars(self._shared), hw_shape=self._hw.get(name))
            with torch.no_grad():
                out = dict(probe.weights(m, args, kwargs, ctx))
            weights = out.pop('weights')
            qg, kg = out.pop('q_grid', None), out.pop('k_grid', None)
            qg = _hw(qg) if qg is not None else ctx.hw_shape
            kg = _hw(kg) if kg is not None else ctx.hw_shape
            call = self._calls.get(name, 0)
            self._calls[name] = call + 1
            rec = AttentionRecord(name, probe.kind, weights.detach(), qg, kg, call, out, probe.form)
            if self.callback is not None:
                rec = self.callback(rec)
            if rec is not None:
                self.records.append(rec)

        return hook
