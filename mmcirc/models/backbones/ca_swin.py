"""CA-Swin and Core-Swin: Swin with circulant / core attention in chosen stages.

Layout (Swin, Liu et al. 2021): a 4x4 patch embedding (padded at the bottom/right when
needed), then four stages, each ending with a 2x2 patch merging except the last, and
an LN on each output. ``'window'`` stages use mmdet's ``SwinBlock`` unchanged
(``WindowBlock``: window 7, shifted every second block, relative position bias);
``'circulant'`` and ``'core'`` stages use :class:`CirculantBlock` / :class:`CoreBlock`
(with the 3x3 depthwise CPE; no windows, no relative position table) with Swin's MLP
(mmcv ``FFN``, ratio 4): ``CASwin.attention_blocks``.

Parameter names are those of mmdet's ``SwinTransformer`` (one-to-one for the parts
kept from it): ``patch_embed.{projection,norm}``, ``stages.{i}.blocks.{j}.{norm1,
attn.w_msa.*, norm2, ffn.layers.0.0, ffn.layers.1}``, ``stages.{i}.downsample.
{reduction,norm}``, ``norm{i}``. Circulant blocks: ``cpe``, ``norm1``,
``attn.{gate.0,qkv,proj}``, ``norm2``, ``ffn.*``; core stages also hold
``stages.{i}.cores``.
"""

from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.transformer import PatchEmbed, PatchMerging
from mmengine.model import ModuleList
from torch import nn

from mmcirc.registry import register_model
from ..blocks import CirculantBlock, CoreBlock, WindowBlock
from ..families import register_family
from .contract import check_positive, check_positive_int, is_int
from .pyramid import PyramidBackbone

__all__ = ['CASwin', 'CoreSwin']


@register_model()
@register_family
class CASwin(PyramidBackbone):
    """Swin pyramid with circulant attention in stages 1-2 (CA-Swin, METHOD.md).

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` or a dict with
            ``embed_dims`` (an int C, giving C-2C-4C-8C, or one width per stage),
            ``depths`` and ``num_heads``.
        attention (str, optional): as in :class:`CAPVT` (``'window'``: plain Swin).
        stage_attentions (str | Sequence[str], optional): as in :class:`CAPVT`; None:
            ``(attention, attention, 'window', 'window')``.
        block_cfgs (dict | Sequence[dict | None], optional): per-stage block configs,
            see :class:`PyramidBackbone`.
        strides (Sequence[int]): patch embedding stride (= kernel) then the patch
            merging strides.
        window_size (int): window of the ``'window'`` stages (7).
        mlp_ratio (float): MLP ratio (4).
        qkv_bias (bool), qk_scale (float, optional): of window and core attention.
        patch_norm (bool): LN after patch embedding / merging.
        out_indices (int | Sequence[int]): stages to output (0-3, negative allowed);
            each gets an LN ``norm{i}``.
        in_channels, drop_rate, attn_drop_rate, drop_path_rate, circulant_heads,
            boundary, scale, num_cores, num_cores_max, core_chunk_size: as in
            :class:`CAPVT`.
        core_cpe (bool): CPE in core blocks (on: Swin has no position embedding).
        act_cfg, norm_cfg (dict): activation and norm (LN).
        frozen_stages (int): -1 none; 0 the patch embedding; k >= 1 also stages 1..k
            (with their patch merging and output norms), as mmdet's Swin.
        norm_eval (bool), with_cp (bool), init_cfg: as in :class:`CAPVT`.
    """

    arch_zoo = {
        'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
        'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
        'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    }
    family = 'swin'
    attention_blocks = dict(circulant=CirculantBlock, core=CoreBlock, window=WindowBlock)
    original_attention = 'window'
    default_attention = 'circulant'
    stages_attr = 'stages'
    stem = ('patch_embed', 'drop_after_pos')
    out_norm = 'norm{}'
    conv_init = None

    def __init__(
        self,
        arch='tiny',
        attention=None,
        stage_attentions=None,
        in_channels=3,
        strides=(4, 2, 2, 2),
        window_size=7,
        mlp_ratio=4,
        qkv_bias=True,
        qk_scale=None,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.1,
        circulant_heads=None,
        boundary='circular',
        scale='sqrt_n',
        num_cores=None,
        num_cores_max=64,
        core_chunk_size=None,
        core_cpe=True,
        act_cfg=dict(type='GELU'),
        norm_cfg=dict(type='LN'),
        frozen_stages=-1,
        norm_eval=False,
        with_cp=False,
        block_cfgs=None,
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        self._setup(
            arch=arch,
            attention=attention,
            stage_attentions=stage_attentions,
            block_cfgs=block_cfgs,
            in_channels=in_channels,
            qkv_bias=qkv_bias,
            out_indices=out_indices,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
            circulant_heads=circulant_heads,
            boundary=boundary,
            scale=scale,
            num_cores=num_cores,
            num_cores_max=num_cores_max,
            core_chunk_size=core_chunk_size,
            core_cpe=core_cpe,
            act_cfg=act_cfg,
            norm_cfg=norm_cfg,
            frozen_stages=frozen_stages,
            norm_eval=norm_eval,
            with_cp=with_cp,
        )
        n = self.num_stages
        strides = self._per_stage('strides', strides, n, lambda v: is_int(v) and v >= 1)
        check_positive_int(type(self).__name__, 'window_size', window_size)
        check_positive(type(self).__name__, 'mlp_ratio', mlp_ratio)
        patch_norm_cfg = norm_cfg if patch_norm else None
        self.patch_embed = PatchEmbed(
            in_channels=in_channels,
            embed_dims=self.embed_dims[0],
            conv_type='Conv2d',
            kernel_size=strides[0],
            stride=strides[0],
            padding='corner',
            norm_cfg=patch_norm_cfg,
        )
        self.drop_after_pos = nn.Dropout(p=drop_rate)

        self.stages = ModuleList()
        for i in range(n):
            dims = self.embed_dims[i]
            own = dict(  # the window block's (besides the MLP's)
                num_heads=self.num_heads[i],
                window_size=window_size,
                qkv_bias=qkv_bias,
                qk_scale=qk_scale,
                attn_drop_rate=attn_drop_rate,
                with_cp=False,
            )
            # the blocks before the merging, as mmdet builds them (the same seeded init)
            blocks = self._build_blocks(i, mlp_ratio, own)
            downsample = (
                PatchMerging(
                    in_channels=dims,
                    out_channels=self.embed_dims[i + 1],
                    stride=strides[i + 1],
                    norm_cfg=patch_norm_cfg,
                )
                if i < n - 1
                else None
            )
            self.stages.append(self._build_stage(i, blocks, downsample=downsample))
        for i in self.out_indices:  # an LN per output, as mmdet's Swin
            self.add_module(f'norm{i}', build_norm_layer(norm_cfg, self.embed_dims[i])[1])
        self._finish()

    @classmethod
    def _stage_widths(cls, embed_dims, num_stages):
        if is_int(embed_dims):
            return tuple(embed_dims * 2**i for i in range(num_stages))
        return tuple(embed_dims)

    def _stem_modules(self):
        return [self.patch_embed, self.drop_after_pos]


@register_model()
@register_family
class CoreSwin(CASwin):
    """:class:`CASwin` with core attention in stages 1-2 by default (``attention='core'``)."""

    default_attention = 'core'
