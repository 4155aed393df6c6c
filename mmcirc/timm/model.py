"""timm's model interface around mmcirc's backbones: :class:`TimmModel`, what every
family shares (the isotropic families: :mod:`.isotropic`; the pyramids: :mod:`.pyramid`).

A model is ``backbone`` (the mmcirc backbone, unchanged, under ``backbone.``) and
timm's head (pooling, ``head_drop``, ``head``), built on ``device`` (``'meta'``: no
memory, no init; ``to_empty`` then :meth:`TimmModel.init_weights` makes it real).

``torch.fx`` traces a model down to the backbone's stages and blocks (the leaves:
:meth:`TimmModel.fx_leaves`), so the ``feature_info`` modules are nodes of the graph:
``features_only=True`` takes ``feature_cls='fx'`` (:class:`FeatureGraph`) besides the
default ``'getter'``.
"""

import contextlib
import logging
import re
from typing import List, Optional, Sequence, Set

import torch
from timm.models import register_notrace_function, register_notrace_module
from timm.models._features import FeatureGetterNet
from timm.models._features_fx import FeatureGraphNet
from torch import nn

from mmcirc.models.backbones.contract import HAS_MMENGINE, is_int, parse_out_indices

__all__ = [
    'FeatureGetter',
    'FeatureGraph',
    'PoolTypeError',
    'TimmModel',
    'building_on',
    'init_backbone',
    'take_indices',
]

_logger = logging.getLogger(__name__)


class PoolTypeError(ValueError, AssertionError):
    """A ``global_pool`` the model does not take: a ValueError, and the AssertionError
    timm's own models raise for one (which timm's callers catch)."""


def init_backbone(backbone) -> None:
    """The backbone's own init (mmengine's, with its per-tensor log kept quiet); none
    on the meta device (nothing to fill: :meth:`TimmModel.init_weights` does it later)."""
    if any(p.is_meta for p in backbone.parameters()):
        return
    from mmcirc.utils.quiet import quiet_logger

    with quiet_logger() if HAS_MMENGINE else contextlib.nullcontext():
        backbone.init_weights()


def building_on(device):
    """Modules built inside are created on ``device`` (None: the default device)."""
    return contextlib.nullcontext() if device is None else torch.device(device)


def take_indices(indices, num: int, unit: str = 'blocks') -> List[int]:
    """timm's ``indices`` of :meth:`TimmModel.forward_intermediates`: None all, an int n
    the last n, ints (negative from the end) those; sorted. ValueError otherwise."""
    if indices is None:
        return list(range(num))
    if is_int(indices):
        if not 0 < indices <= num:
            raise ValueError(
                f'indices: an int is the last n {unit}, n in [1, {num}], got {indices!r}'
            )
        return list(range(num - indices, num))
    return list(parse_out_indices(tuple(indices), num, unit))


class FeatureGetter(FeatureGetterNet):
    """timm's ``FeatureGetterNet`` (``features_only=True``) that also switches the wrapped
    model's gradient checkpointing, as dense trainers do on a features-only backbone."""

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.model.set_grad_checkpointing(enable)


class FeatureGraph(FeatureGraphNet):
    """timm's ``FeatureGraphNet`` (``feature_cls='fx'``: the outputs of the
    ``feature_info`` modules, out of a ``torch.fx`` graph of the model) giving the maps
    of :meth:`TimmModel.forward_intermediates` (:meth:`TimmModel.feature_map_fn`), the
    indices taken as the getter takes them (:func:`take_indices`; as given with an
    ``out_map``). ``output_fmt`` changes nothing: the maps are NCHW."""

    def __init__(self, model, out_indices, out_map=None, output_fmt='NCHW', return_dict=False):
        if out_map is None:
            out_indices = model._check_indices(out_indices)
        super().__init__(model, out_indices, out_map=out_map, return_dict=return_dict)
        self.to_map = model.feature_map_fn()

    def forward(self, x):
        out = self.graph_module(x)
        if self.to_map is not None:
            out = {k: self.to_map(v, x) for k, v in out.items()}
        return out if self.return_dict else list(out.values())


class TimmModel(nn.Module):
    """timm's classifier interface around an mmcirc backbone (abstract).

    A family sets ``pool_types`` (the ``global_pool`` values it takes), ``output_fmt``
    and implements :meth:`forward_features`, :meth:`_pool`, :meth:`_intermediates`,
    :meth:`_prune`, :meth:`group_matcher`, :meth:`_set_with_cp`.

    Args:
        backbone (nn.Module): the mmcirc backbone.
        num_features (int): width of the final features.
        feature_info (list[dict]): timm's ``num_chs``, ``reduction``, ``module`` per
            output the family offers (blocks or stages).
        num_classes (int): classifier outputs; 0: no classifier (``head`` is Identity).
        global_pool (str): one of ``pool_types`` (``''``: no pooling).
        drop_rate (float): dropout before the classifier (timm's head dropout).
        in_chans (int): image channels.
        dtype (torch.dtype, optional): of the parameters (None: the default).
    """

    pool_types: Sequence[str] = ('avg', '')
    output_fmt: str = 'NCHW'
    #: the released checkpoint this family loads (``'deit'``, ``'veca'``: the
    #: ``RELEASED`` kinds of the converters, :mod:`.weights`); None: mmcirc's own only
    released_kind: Optional[str] = None

    def __init__(
        self,
        backbone,
        num_features,
        feature_info,
        num_classes,
        global_pool,
        drop_rate,
        in_chans=3,
        dtype=None,
    ):
        super().__init__()
        if not is_int(num_classes) or num_classes < 0:
            raise ValueError(f'num_classes must be an int >= 0, got {num_classes!r}')
        self.backbone = backbone.to(dtype=dtype) if dtype is not None else backbone
        modules, functions = self.fx_leaves()
        for module in modules:
            register_notrace_module(module)
        for function in functions:
            register_notrace_function(function)
        self.in_chans = int(in_chans)
        self.num_features = self.head_hidden_size = int(num_features)
        self.feature_info = feature_info
        self.grad_checkpointing = False
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Identity()
        self.global_pool = None
        self.reset_classifier(num_classes, global_pool)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def _set_pool(self, global_pool: str) -> int:
        """Set the pooling ``global_pool`` (checked); returns the width multiplier
        (2 for concatenated poolings)."""
        return 1

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new classifier for ``num_classes`` (0: none), truncated normal std 0.02,
        zero bias, on the device and in the dtype of the model; ``global_pool`` (one
        of ``pool_types``) if given, else the current one."""
        if global_pool is not None:
            if global_pool not in self.pool_types:
                raise PoolTypeError(
                    f'{type(self).__name__}: global_pool must be one of {tuple(self.pool_types)}, '
                    f'got {global_pool!r}'
                )
            self.global_pool = global_pool
        self.head_hidden_size = self.num_features * self._set_pool(self.global_pool)
        self.num_classes = int(num_classes)
        if num_classes:
            ref = next(self.backbone.parameters())
            head = nn.Linear(self.head_hidden_size, num_classes, device=ref.device, dtype=ref.dtype)
            nn.init.trunc_normal_(head.weight, std=0.02)
            nn.init.zeros_(head.bias)
        else:
            head = nn.Identity()
        self.head = head.train(self.training)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Features of :meth:`forward_features` -> pooled (``pre_logits``) or logits."""
        x = self.head_drop(self._pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C_in, H, W) -> logits (B, num_classes)."""
        return self.forward_head(self.forward_features(x))

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Every block under ``torch.utils.checkpoint`` (the backbone's ``with_cp``)."""
        self.grad_checkpointing = bool(enable)
        self._set_with_cp(self.grad_checkpointing)

    def _set_with_cp(self, enable: bool) -> None:
        self.backbone.with_cp = enable

    #: parameter names (regexes on ``backbone.``-relative names) kept out of weight decay
    no_weight_decay_patterns: Sequence[str] = ()

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """Parameters timm's optimizer factory keeps out of weight decay (besides the
        1-d ones and biases, which it always does): tokens, position tables."""
        return {
            name
            for name, _ in self.named_parameters()
            if any(re.search(p, name) for p in self.no_weight_decay_patterns)
        }

    def init_weights(self) -> None:
        """Every parameter and computed buffer anew, as when the model is built (for a
        model built on ``device='meta'`` and moved with ``to_empty``): PyTorch's
        defaults, then the backbone's own init and the classifier's."""
        for m in self.modules():
            if m is not self and hasattr(m, 'reset_parameters'):
                m.reset_parameters()
            elif isinstance(m, nn.MultiheadAttention):  # PVT's SRA: torch's own init
                m._reset_parameters()
            if hasattr(m, 'is_init'):
                m.is_init = False  # mmengine's: init again
            if hasattr(m, 'init_non_persistent_buffers'):
                m.init_non_persistent_buffers()
        self._init_buffers()
        init_backbone(self.backbone)
        self.reset_classifier(self.num_classes)

    def _init_buffers(self) -> None:
        """Recompute the family's persistent buffers that are functions of the shapes."""

    @staticmethod
    def fx_leaves() -> tuple:
        """(module classes, functions) of the family that ``torch.fx`` does not trace
        through: those whose forward branches on sizes or makes them ints."""
        return (), ()

    def feature_map_fn(self):
        """``fn(output, x)``: the map :meth:`forward_intermediates` gives of a
        ``feature_info`` module's ``output`` for an image ``x`` (:class:`FeatureGraph`);
        None: the output is that map."""

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices=None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = 'NCHW',
        intermediates_only: bool = False,
    ):
        """The outputs of the blocks (stages) ``indices`` (see :func:`take_indices`) as the
        family gives them (:meth:`_intermediates`: ``norm``, ``output_fmt``), with the
        final features unless ``intermediates_only``. ``stop_early`` changes nothing."""
        final, inter = self._intermediates(x, indices, norm, output_fmt)
        return inter if intermediates_only else (final, inter)

    def _intermediates(self, x, indices, norm: bool, output_fmt: str) -> tuple:
        """(final features, [output of each of ``indices``]) of an image x."""
        raise NotImplementedError

    def _check_indices(self, indices) -> List[int]:
        return take_indices(indices, self.backbone.num_stages, self.backbone.stage_unit)

    def prune_intermediate_layers(self, indices=None, prune_norm=False, prune_head=True):
        """timm's ``features_only`` hook: the blocks (stages) after the last of ``indices``
        removed, the final norm with ``prune_norm``, the classifier and pooling with
        ``prune_head``; returns the indices :meth:`forward_intermediates` takes."""
        take = self._check_indices(indices)
        bb, keep = self.backbone, max(take) + 1
        width = self._prune(keep, prune_norm)
        bb.num_stages, bb.out_indices = keep, tuple(range(keep))
        bb.frozen_stages = min(bb.frozen_stages, keep)
        if width != self.num_features or prune_head:
            self.num_features = width
            if prune_head:
                self.reset_classifier(0, '')
            else:
                self.reset_classifier(self.num_classes)
        return take

    def _prune(self, keep: int, prune_norm: bool) -> int:
        """Keep the first ``keep`` blocks (stages) (and the final norm unless
        ``prune_norm``); returns the width of the final features."""
        raise NotImplementedError

    def load_pretrained(self, path: str) -> None:
        """Load a checkpoint file (timm's ``custom_load``): read safely, converted by
        :func:`~mmcirc.timm.weights.checkpoint_filter_fn`, the classifier dropped
        where the class count differs (as timm does), everything else strict."""
        from .weights import load_checkpoint_file, load_into

        load_into(self, load_checkpoint_file(path))

    def allowed_new_keys(self) -> Sequence[str]:
        """Model keys a checkpoint may lack (besides the classifier): none by default."""
        return ()
