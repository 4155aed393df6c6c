"""The CA/Core pyramids (CA-PVT, Core-PVT, CA-Swin, Core-Swin) as timm models.

The classifier is mmcirc's ImageNet one (``configs/*_in1k.py``: the backbone's last
stage, global average pooling, a linear head), so an mmpretrain checkpoint of those
configs loads as it is (``backbone.*``, ``head.fc.*`` -> ``head.*``). Every model gives
the map of every stage (:meth:`PyramidTimm.forward_intermediates`): CA-Swin's through its
output LN where it has one. A classifier has the last one (``norm3``); with
``features_only=True`` each stage asked for has its own, as in mmdet / mmseg (an
ImageNet checkpoint holds only ``norm3``: the others start at their init, as they do
when mmdet loads it).

Needs mmdet (the pyramids reuse its layers), imported when a model is built.
"""

import torch
from timm.layers import SelectAdaptivePool2d

from mmcirc.models.backbones.contract import is_int
from .model import TimmModel, building_on, init_backbone

__all__ = ['PyramidTimm', 'pyramid_backbones']


def pyramid_backbones() -> dict:
    """timm family name -> backbone class of :data:`~mmcirc.models.families.FAMILIES`:
    ``ca_pvt`` (CAPVT), ``core_pvt``, ``ca_swin``, ``core_swin`` (the ``variant_prefix``
    of the class's default attention block, then its family)."""
    from mmcirc.registry import registries_by_library

    registries_by_library()  # without mmdet: one error naming the package to install
    import mmcirc.models.backbones  # noqa: F401  (adds the pyramids to the table)
    from mmcirc.models.families import pyramid_families

    blocks = {
        c: c.attention_blocks[c.default_attention]
        for classes in pyramid_families().values()
        for c in classes
    }
    return {f'{b.variant_prefix}_{c.family}': c for c, b in blocks.items() if b.variant_prefix}


class PyramidTimm(TimmModel):
    """A CA/Core pyramid as a timm classifier.

    Args:
        family (str): a key of :func:`pyramid_backbones`.
        arch (str | dict): the backbone's arch (``'tiny'``, ``'small'``, ...).
        num_classes, drop_rate: timm's head (see :class:`TimmModel`).
        global_pool (str): ``'avg'`` (mmcirc's classifiers), ``'max'``, ``'avgmax'``,
            ``'catavgmax'`` (timm's ``SelectAdaptivePool2d``) or ``''`` (none).
        in_chans (int): image channels.
        proj_drop_rate (float): the backbone's dropout (``drop_rate`` of the mmcirc
            backbone; timm's ``drop_rate`` is the head's); ``attn_drop_rate`` passes on.
        drop_path_rate (float): stochastic depth of the backbone.
        feature_indices (Sequence[int], optional): the stages with an output LN
            (CA-Swin; timm's ``out_indices`` with ``features_only=True``); None: the
            last (the classifier).
        device, dtype: of the parameters (None: the defaults).
        **backbone_kwargs: the backbone's other arguments (``num_cores``, ``boundary``,
            ``attention``, ``stage_attentions``, ...).
    """

    pool_types = ('avg', 'max', 'avgmax', 'catavgmax', '')
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
        device=None,
        dtype=None,
        **backbone_kwargs,
    ):
        classes = pyramid_backbones()
        if family not in classes:
            raise ValueError(f'family must be one of {tuple(classes)}, got {family!r}')
        cls = classes[family]
        if feature_indices is None:
            out_indices = (-1,)  # the classifier: the last stage
        elif is_int(feature_indices):
            out_indices = tuple(range(-feature_indices, 0))  # timm's int: the last n stages
        else:
            out_indices = tuple(feature_indices)
        with building_on(device):
            backbone = cls(
                arch=arch,
                in_channels=in_chans,
                drop_rate=proj_drop_rate,
                drop_path_rate=drop_path_rate,
                out_indices=out_indices,
                **backbone_kwargs,
            )
            init_backbone(backbone)
            backbone.out_indices = tuple(range(backbone.num_stages))  # output LNs as built
        attr = backbone.stages_attr
        info = [
            dict(num_chs=backbone.embed_dims[i], reduction=s, module=f'backbone.{attr}.{i}')
            for i, s in enumerate(backbone.stage_strides())
        ]
        super().__init__(
            backbone,
            backbone.embed_dims[-1],
            info,
            num_classes,
            global_pool,
            drop_rate,
            in_chans,
            dtype,
        )
        self.family, self.arch, self.stages_attr = family, arch, attr
        self.no_weight_decay_patterns = (
            r'\.cores$',  # the core banks
            r'\.pos_embed\.pos_embed$',  # PVT's position tables
            r'\.relative_position_bias_table$',  # Swin's window stages
        )

    @staticmethod
    def fx_leaves():
        """The stages' size-dependent parts, and what every pyramid block declares
        (``PyramidBlock.fx_leaves``: its attention operator)."""
        from mmcv.cnn.bricks.transformer import AdaptivePadding, PatchMerging
        from mmdet.models.backbones.pvt import AbsolutePositionEmbedding
        from mmdet.models.layers import nchw_to_nlc, nlc_to_nchw

        from mmcirc.models.backbones.pyramid import grid_size
        from mmcirc.models.families import attention_blocks
        from mmcirc.ops.core import select_cores

        stages = (
            AdaptivePadding,  # padding computed from the input size
            PatchMerging,
            AbsolutePositionEmbedding,  # resized to the map
        )
        blocks = tuple(leaf for cls in attention_blocks().values() for leaf in cls.fx_leaves)
        return stages + blocks, (nlc_to_nchw, nchw_to_nlc, grid_size, select_cores)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C_in, H, W) -> the last stage's map (B, C_4, H/32, W/32)."""
        return self.backbone(x)[-1]

    def _set_pool(self, global_pool: str) -> int:
        self.pool = SelectAdaptivePool2d(pool_type=global_pool, flatten=bool(global_pool))
        self.pool.train(self.training)
        return self.pool.feat_mult()

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)  # (B, C) (catavgmax: (B, 2C)) | (B, C, H, W)

    def _intermediates(self, x, indices, norm, output_fmt):
        """The maps (B, C_i, H_i, W_i) of the stages as the backbone gives them (CA-Swin:
        through the stage's output LN where it has one); the last the final features.
        ``norm`` changes nothing (the output LNs belong to their stages)."""
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt must be 'NCHW' for the pyramids, got {output_fmt!r}")
        take = self._check_indices(indices)
        maps = self.backbone(x)  # one per stage
        return maps[-1], [maps[i] for i in take]

    def _prune(self, keep: int, prune_norm: bool) -> int:
        """Stages ``keep`` on (and the patch merging ending stage ``keep - 1``) removed,
        with their output LNs; ``prune_norm`` changes nothing (as ``norm`` above)."""
        bb = self.backbone
        del bb.stages[keep:]
        bb.stages[keep - 1].downsample = None
        for i in range(keep, bb.num_stages):
            if hasattr(bb, f'norm{i}'):
                delattr(bb, f'norm{i}')
        return bb.embed_dims[keep - 1]

    def _init_buffers(self) -> None:
        """mmdet's window attention: its relative position index (a persistent buffer)."""
        from mmdet.models.backbones.swin import WindowMSA

        for m in self.modules():
            if isinstance(m, WindowMSA):
                wh, ww = m.window_size
                coords = m.double_step_seq(2 * ww - 1, wh, 1, ww)
                index = (coords + coords.T).flip(1).contiguous()
                m.relative_position_index.copy_(index.to(m.relative_position_index.device))

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
            blocks = [(rf'^backbone\.{a}\.(\d+)', None), (r'^backbone\.norm', (99999,))]
        else:
            blocks = [
                (rf'^backbone\.{a}\.(\d+)\.blocks\.(\d+)', None),
                (rf'^backbone\.{a}\.(\d+)\.(?:patch_embed|pos_embed|cores)', (0,)),
                (rf'^backbone\.{a}\.(\d+)\.(?:norm|downsample)', (99999,)),
                (r'^backbone\.norm(\d+)', (99999,)),
            ]
        return dict(stem=stem, blocks=blocks)

    def allowed_new_keys(self):
        """CA-Swin's output LNs of the stages other than the last (see the module)."""
        last = self.backbone.num_stages - 1
        return tuple(
            k
            for k in self.state_dict()
            if k.startswith('backbone.norm') and not k.startswith(f'backbone.norm{last}.')
        )
