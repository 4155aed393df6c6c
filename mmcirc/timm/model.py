"""timm's model interface around mmcirc's backbones: :class:`TimmModel` (what every
family shares) and the isotropic families :class:`CADeiTTimm` and :class:`VECATimm`
(the pyramids: :mod:`.pyramid`).

A model is ``backbone`` (the mmcirc backbone, unchanged: its parameters keep their
names under ``backbone.``) followed by timm's head: global pooling, ``head_drop``
(``drop_rate``) and ``head`` (a linear classifier, ``nn.Identity`` for
``num_classes=0``). The backbone returns the outputs of all its blocks (isotropic) or
the stages asked for (pyramids); :meth:`TimmModel.forward_features` takes the last,
:meth:`TimmModel.forward_intermediates` (timm's ``features_only=True``) the chosen ones.

Torch only: CA-DeiT and VECA need nothing else; the pyramids need mmdet where they are
built (:mod:`.pyramid`).
"""

import logging
import re
from typing import List, Optional, Sequence, Set

import torch
from torch import nn

from mmcirc.models.backbones.contract import HAS_MMENGINE, is_int, parse_out_indices

__all__ = ['CADeiTTimm', 'TimmModel', 'VECATimm', 'init_weights', 'take_indices']

_logger = logging.getLogger(__name__)


def init_weights(backbone) -> None:
    """The backbone's own init (mmengine's, with its per-tensor log kept quiet)."""
    if not HAS_MMENGINE:
        backbone.init_weights()
        return
    from mmcirc.utils.quiet import quiet_logger

    with quiet_logger():
        backbone.init_weights()


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


class TimmModel(nn.Module):
    """timm's classifier interface around an mmcirc backbone (abstract).

    A family sets ``pool_types`` (the ``global_pool`` values it takes, the first the
    default), ``output_fmt`` and implements :meth:`forward_features`, :meth:`_pool`,
    :meth:`forward_intermediates`, :meth:`group_matcher`, :meth:`_set_with_cp`.

    Args:
        backbone (nn.Module): the mmcirc backbone.
        num_features (int): width of the pooled feature.
        feature_info (list[dict]): timm's ``num_chs``, ``reduction``, ``module`` per
            output the family offers (blocks or stages).
        num_classes (int): classifier outputs; 0: no classifier (``head`` is Identity).
        global_pool (str): one of ``pool_types`` (``''``: no pooling).
        drop_rate (float): dropout before the classifier (timm's head dropout).
    """

    pool_types: Sequence[str] = ('avg', '')
    output_fmt: str = 'NCHW'
    #: the released checkpoint this family loads (``'deit'``, ``'veca'``: the
    #: ``RELEASED`` kinds of the converters, :mod:`.weights`); None: mmcirc's own only
    released_kind: Optional[str] = None

    def __init__(self, backbone, num_features, feature_info, num_classes, global_pool, drop_rate):
        super().__init__()
        if not is_int(num_classes) or num_classes < 0:
            raise ValueError(f'num_classes must be an int >= 0, got {num_classes!r}')
        self.backbone = backbone
        self.num_features = self.head_hidden_size = int(num_features)
        self.feature_info = feature_info
        self.grad_checkpointing = False
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Identity()
        self.reset_classifier(num_classes, global_pool)

    # ------------------------------------------------------------------ head
    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new classifier for ``num_classes`` (0: none), truncated normal std 0.02,
        zero bias; ``global_pool`` (one of ``pool_types``) if given."""
        if global_pool is not None:
            if global_pool not in self.pool_types:
                raise ValueError(
                    f'{type(self).__name__}: global_pool must be one of {tuple(self.pool_types)}, '
                    f'got {global_pool!r}'
                )
            self.global_pool = global_pool
        self.num_classes = int(num_classes)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes else nn.Identity()
        if num_classes:
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Features of :meth:`forward_features` -> pooled (``pre_logits``) or logits."""
        x = self.head_drop(self._pool(x))
        return x if pre_logits else self.head(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C_in, H, W) -> logits (B, num_classes)."""
        return self.forward_head(self.forward_features(x))

    # ------------------------------------------------------------------ training
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

    # ------------------------------------------------------------------ features
    def prune_intermediate_layers(self, indices=None, prune_norm=False, prune_head=True):
        """timm's ``features_only`` hook: the indices :meth:`forward_intermediates` will
        take (no block is removed); ``prune_head`` drops the classifier."""
        take = self._check_indices(indices)
        if prune_head:
            self.reset_classifier(0, '')
        return take

    def _check_indices(self, indices) -> List[int]:
        return take_indices(indices, len(self.feature_info))

    # ------------------------------------------------------------------ weights
    def load_pretrained(self, path: str) -> None:
        """Load a checkpoint file (timm's ``custom_load``): read safely, converted by
        :func:`~mmcirc.timm.weights.checkpoint_filter_fn`, the classifier dropped
        where the class count differs (as timm does), everything else strict."""
        from .weights import load_checkpoint_file, load_into

        load_into(self, load_checkpoint_file(path))

    def allowed_new_keys(self) -> Sequence[str]:
        """Model keys a checkpoint may lack (besides the classifier): none by default."""
        return ()


# --------------------------------------------------------------------------- isotropic
class _Isotropic(TimmModel):
    """Shared by CA-DeiT and VECA: the backbone returns every block's output."""

    output_fmt = 'NLC'

    def __init__(self, backbone, num_features, num_classes, global_pool, drop_rate):
        backbone.out_indices = tuple(range(backbone.num_stages))  # every block's output
        info = [
            dict(
                num_chs=backbone.embed_dims,
                reduction=backbone.patch_size,
                module=f'backbone.blocks.{i}',
            )
            for i in range(backbone.num_stages)
        ]
        info[-1]['num_chs'] = int(num_features)
        super().__init__(backbone, num_features, info, num_classes, global_pool, drop_rate)
        self.patch_size = backbone.patch_size

    def _grid(self, x: torch.Tensor) -> tuple:
        """(H', W') of the token map of an image x (B, C, H, W), padding included."""
        p = self.patch_size
        return -(-x.shape[-2] // p), -(-x.shape[-1] // p)

    @staticmethod
    def _as_fmt(tokens: torch.Tensor, hw, output_fmt: str) -> torch.Tensor:
        if output_fmt == 'NLC':
            return tokens  # (B, N, C)
        b, n, c = tokens.shape
        return tokens.transpose(1, 2).reshape(b, c, *hw)  # (B, C, H', W')

    def _final(self, outs) -> torch.Tensor:
        """The backbone's block outputs ``outs`` -> :meth:`forward_features`' result."""
        raise NotImplementedError

    def _block_tokens(self, outs, i: int, norm: bool) -> torch.Tensor:
        """Block ``i``'s patch tokens (B, N, C) of the outputs ``outs`` (``norm``: as
        :meth:`forward_intermediates` takes them)."""
        raise NotImplementedError

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C_in, H, W) -> the final features (see the family's docstring)."""
        return self._final(self.backbone(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices=None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = 'NCHW',
        intermediates_only: bool = False,
    ):
        """The patch tokens of the blocks ``indices`` (see :func:`take_indices`; ``norm``:
        see the family's :meth:`_block_tokens`) as (B, C, H', W') maps or (B, N, C)
        tokens (``output_fmt``); with the final features unless ``intermediates_only``.
        ``stop_early`` changes nothing."""
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, hw = self._check_indices(indices), self._grid(x)
        outs = self.backbone(x)  # one output per block
        inter = [self._as_fmt(self._block_tokens(outs, i, norm), hw, output_fmt) for i in take]
        if intermediates_only:
            return inter
        return self._final(outs), inter

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups for timm's layer-wise learning-rate decay."""
        return dict(
            stem=self.stem_pattern, blocks=[(r'^backbone\.blocks\.(\d+)', None)] + self.tail
        )


class CADeiTTimm(_Isotropic):
    """CA-DeiT (:class:`~mmcirc.models.backbones.CADeiT`) as a timm model.

    ``forward_features``: the final-LN tokens (B, N, C); ``global_pool='avg'`` (the
    official head: the mean over the tokens) or ``''``. Any H x W (no position
    embedding; ``img_size`` and ``dynamic_img_size`` are accepted for timm's scripts and
    change nothing). timm's names: ``drop_rate`` the head dropout, ``proj_drop_rate``
    the backbone's (attention projection and MLP), ``drop_path_rate`` stochastic depth.
    Other keyword arguments go to the backbone (``patch_size``, ``boundary``, ``scale``,
    ``circulant_heads``, ...).
    """

    pool_types = ('avg', '')
    released_kind = 'deit'
    stem_pattern = r'^backbone\.patch_embed'
    tail = [(r'^backbone\.norm', (99999,))]

    def __init__(
        self,
        arch='tiny',
        num_classes: int = 1000,
        global_pool: str = 'avg',
        in_chans: int = 3,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        img_size=None,
        dynamic_img_size: bool = True,
        **backbone_kwargs,
    ):
        from mmcirc.models.backbones.ca_deit import CADeiT

        backbone = CADeiT(
            arch=arch,
            in_channels=in_chans,
            out_type='raw',
            final_norm=False,  # the final LN is applied here (intermediates stay raw)
            drop_rate=proj_drop_rate,
            drop_path_rate=drop_path_rate,
            **backbone_kwargs,
        )
        init_weights(backbone)
        super().__init__(backbone, backbone.embed_dims, num_classes, global_pool, drop_rate)
        self.arch = arch

    def _final(self, outs) -> torch.Tensor:
        """One (B, N, C) per block -> the final-LN tokens (B, N, C), N = ceil(H/p) * ceil(W/p)."""
        return self.backbone.norm(outs[-1])

    def _block_tokens(self, outs, i: int, norm: bool) -> torch.Tensor:
        """Block ``i``'s output (B, N, C), raw or through the final LN (``norm``)."""
        return self.backbone.norm(outs[i]) if norm else outs[i]

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1) if self.global_pool == 'avg' else x  # (B, C) | (B, N, C)


class VECATimm(_Isotropic):
    """VECA (:class:`~mmcirc.models.backbones.VECAViT`) as a timm model.

    ``forward_features``: the final sequence ``[cores; patches]`` (B, C' + N, D) (the
    first ``num_prefix_tokens`` = C' are the cores); ``global_pool='token'`` (the
    global token, the first core: the official feature), ``'avg'`` (the mean of the
    patches) or ``''``. ``num_cores`` (C', an int multiple of 8 or a preset name) is an
    option, changed later with :meth:`set_num_cores`. Any H x W. ``drop_rate`` is the
    head dropout, ``proj_drop_rate`` the backbone's (the official ``dropout``). Other
    keyword arguments go to the backbone (``patch_size``, the RoPE settings,
    ``out_channels``, ...).
    """

    pool_types = ('token', 'avg', '')
    released_kind = 'veca'
    stem_pattern = r'^backbone\.(?:patch_embed|cores|core_coords|pos_alpha)'
    tail = [
        (r'^backbone\.pos_linears\.(\d+)', None),
        (r'^backbone\.(?:final_norm|output_proj)', (99999,)),
    ]
    no_weight_decay_patterns = (r'^backbone\.(?:cores|core_coords|pos_alpha)$',)

    def __init__(
        self,
        arch='base',
        num_classes: int = 0,
        global_pool: str = 'token',
        in_chans: int = 3,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        num_cores=None,
        img_size=None,
        dynamic_img_size: bool = True,
        **backbone_kwargs,
    ):
        from mmcirc.models.backbones.veca import VECAViT

        backbone = VECAViT(
            arch=arch,
            in_channels=in_chans,
            num_cores=num_cores,
            out_type='raw',
            dropout=proj_drop_rate,
            **backbone_kwargs,
        )
        init_weights(backbone)
        super().__init__(backbone, backbone.num_features, num_classes, global_pool, drop_rate)
        self.arch, self.backbone_kwargs = arch, dict(backbone_kwargs)

    @property
    def num_prefix_tokens(self) -> int:
        """The cores C' ahead of the patches in :meth:`forward_features`' sequence."""
        return self.backbone.num_cores

    def set_num_cores(self, num_cores) -> None:
        """The active core count C' (:meth:`VECAViT.set_num_cores`)."""
        self.backbone.set_num_cores(num_cores)

    def _final(self, outs) -> torch.Tensor:
        """One (cores, patches) per block -> the final sequence [cores; patches] (B, C' + N, D)."""
        cores, patches = outs[-1]  # (B, C', D), (B, N, D)
        return torch.cat([cores, patches], dim=1)  # (B, C' + N, D)

    def _block_tokens(self, outs, i: int, norm: bool) -> torch.Tensor:
        """Block ``i``'s patches (B, N, D): the last through the final LN and output
        projection, as the backbone gives it; ``norm``: the others through the final LN."""
        patches = outs[i][1]  # (B, N, D)
        return self.backbone.final_norm(patches) if norm and i != len(outs) - 1 else patches

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        if self.global_pool == 'token':
            return x[:, 0]  # (B, D): the global token
        if self.global_pool == 'avg':
            return x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, D): mean of the patches
        return x
