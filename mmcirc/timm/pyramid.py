"""The CA/Core pyramids (CA-PVT, Core-PVT, CA-Swin, Core-Swin) as timm models.

The classifier is mmcirc's ImageNet one (``configs/*_in1k.py``: the backbone's last
stage, global average pooling, a linear head), so an mmpretrain checkpoint of those
configs loads as it is (``backbone.*``, ``head.fc.*`` -> ``head.*``). With
``features_only=True`` the backbone outputs the stages asked for; CA-Swin then has an
output LN per stage, as in mmdet / mmseg (an ImageNet checkpoint holds only the last
one, ``norm3``: the others start at their init, as they do when mmdet loads it).

Needs mmdet (the pyramids reuse its layers), imported when a model is built.
"""

import math

import torch

from mmcirc.models.backbones.contract import is_int
from .model import TimmModel, init_weights, take_indices

__all__ = ['PyramidTimm', 'PYRAMID_BACKBONES']

#: timm family name -> (mmcirc backbone class, the kwarg holding the stage strides).
PYRAMID_BACKBONES = {
    'ca_pvt': ('CAPVT', 'patch_sizes'),
    'core_pvt': ('CorePVT', 'patch_sizes'),
    'ca_swin': ('CASwin', 'strides'),
    'core_swin': ('CoreSwin', 'strides'),
}


def _backbone_class(name: str):
    from mmcirc.registry import registries_by_library

    registries_by_library()  # without mmdet: one error naming the package to install
    from mmcirc.models import backbones

    return getattr(backbones, name)


class PyramidTimm(TimmModel):
    """A CA/Core pyramid as a timm classifier (``global_pool='avg'`` or ``''``).

    Args:
        family (str): a key of :data:`PYRAMID_BACKBONES`.
        arch (str | dict): the backbone's arch (``'tiny'``, ``'small'``, ...).
        num_classes, global_pool, drop_rate: timm's head (see :class:`TimmModel`).
        in_chans (int): image channels.
        proj_drop_rate (float): the backbone's dropout (``drop_rate`` of the mmcirc
            backbone; timm's ``drop_rate`` is the head's); ``attn_drop_rate`` passes on.
        drop_path_rate (float): stochastic depth of the backbone.
        feature_indices (Sequence[int], optional): the stages the backbone outputs (timm's
            ``out_indices`` with ``features_only=True``); None: the last (the classifier).
        **backbone_kwargs: the backbone's other arguments (``num_cores``, ``boundary``,
            ``attention``, ``stage_attentions``, ...).
    """

    pool_types = ('avg', '')
    output_fmt = 'NCHW'

    def __init__(
        self,
        family: str,
        arch='tiny',
        num_classes: int = 1000,
        global_pool: str = 'avg',
        in_chans: int = 3,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        feature_indices=None,
        **backbone_kwargs,
    ):
        if family not in PYRAMID_BACKBONES:
            raise ValueError(f'family must be one of {tuple(PYRAMID_BACKBONES)}, got {family!r}')
        name, stride_key = PYRAMID_BACKBONES[family]
        cls = _backbone_class(name)
        if feature_indices is None:
            out_indices = (-1,)  # the classifier: the last stage
        elif is_int(feature_indices):
            out_indices = tuple(range(-feature_indices, 0))  # timm's int: the last n stages
        else:
            out_indices = tuple(feature_indices)
        backbone = cls(
            arch=arch,
            in_channels=in_chans,
            drop_rate=proj_drop_rate,
            drop_path_rate=drop_path_rate,
            out_indices=out_indices,
            **backbone_kwargs,
        )
        init_weights(backbone)
        n, attr = backbone.num_stages, backbone.stages_attr
        strides = backbone_kwargs.get(stride_key, (4, 2, 2, 2))
        strides = (strides,) * n if is_int(strides) else tuple(strides)  # as the backbone takes it
        info = [
            dict(
                num_chs=backbone.embed_dims[i],
                reduction=math.prod(strides[: i + 1]),
                module=f'backbone.{attr}.{i}',
            )
            for i in range(n)
        ]
        super().__init__(
            backbone, backbone.embed_dims[-1], info, num_classes, global_pool, drop_rate
        )
        self.family, self.arch, self.stages_attr = family, arch, attr
        self.no_weight_decay_patterns = (
            r'\.cores$',  # the core banks
            r'\.pos_embed\.pos_embed$',  # PVT's position tables
            r'\.relative_position_bias_table$',  # Swin's window stages
        )

    # ------------------------------------------------------------------ forward
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C_in, H, W) -> the last stage's map (B, C_4, H/32, W/32)."""
        if self.backbone.out_indices[-1] != self.backbone.num_stages - 1:
            raise ValueError(
                'forward_features needs the last stage; this model was built with '
                f'out_indices={self.backbone.out_indices} (features_only)'
            )
        return self.backbone(x)[-1]

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) if self.global_pool == 'avg' else x  # (B, C) | (B, C, H, W)

    def _check_indices(self, indices):
        take = take_indices(indices, self.backbone.num_stages, 'stages')
        missing = [i for i in take if i not in self.backbone.out_indices]
        if missing:
            raise ValueError(
                f'indices: stages {missing} are not outputs of this model (built for '
                f'{self.backbone.out_indices}); create it with features_only=True, '
                f'out_indices={tuple(take)}'
            )
        return take

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices=None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = 'NCHW',
        intermediates_only: bool = False,
    ):
        """The maps (B, C_i, H_i, W_i) of the stages ``indices`` (outputs the model was
        built for), as the backbone gives them (CA-Swin: through its output LNs);
        with the last stage's map unless ``intermediates_only`` (then the model must
        output the last stage)."""
        if norm:
            raise ValueError('norm must be False: the pyramids output their maps as mmdet does')
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt must be 'NCHW' for the pyramids, got {output_fmt!r}")
        take, last = self._check_indices(indices), self.backbone.num_stages - 1
        if not intermediates_only and last not in self.backbone.out_indices:
            raise ValueError(
                f'intermediates_only=False needs the last stage ({last}); this model was '
                f'built with out_indices={self.backbone.out_indices}: pass '
                'intermediates_only=True'
            )
        outs = dict(zip(self.backbone.out_indices, self.backbone(x)))  # stage -> map
        inter = [outs[i] for i in take]
        if intermediates_only:
            return inter
        return outs[last], inter

    # ------------------------------------------------------------------ training
    def _set_with_cp(self, enable: bool) -> None:
        self.backbone.with_cp = enable
        for stage in self.backbone.stages:
            stage.with_cp = enable

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups for layer-wise decay: the stem, then stage by stage (block
        by block unless ``coarse``), the output norms last."""
        a = self.stages_attr
        stem = (
            rf'^backbone\.{a}\.0\.(?:patch_embed|pos_embed)'
            if a == 'layers'
            else r'^backbone\.(?:patch_embed|drop_after_pos)'
        )
        if coarse:
            return dict(
                stem=stem,
                blocks=[(rf'^backbone\.{a}\.(\d+)', None), (r'^backbone\.norm', (99999,))],
            )
        return dict(
            stem=stem,
            blocks=[
                (rf'^backbone\.{a}\.(\d+)\.blocks\.(\d+)', None),
                (rf'^backbone\.{a}\.(\d+)\.(?:patch_embed|pos_embed|cores)', (0,)),
                (rf'^backbone\.{a}\.(\d+)\.(?:norm|downsample)', (99999,)),
                (r'^backbone\.norm(\d+)', (99999,)),
            ],
        )

    def allowed_new_keys(self):
        """CA-Swin's output LNs of the stages other than the last (see the module)."""
        last = self.backbone.num_stages - 1
        return tuple(
            k
            for k in self.state_dict()
            if k.startswith('backbone.norm') and not k.startswith(f'backbone.norm{last}.')
        )
