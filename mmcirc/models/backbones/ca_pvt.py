"""CA-PVT and Core-PVT: PVT v1 with circulant / core attention in chosen stages.

Layout (PVT v1, Wang et al. 2021): each stage starts with a non-overlapping patch
embedding (kernel = stride = 4, 2, 2, 2, padded at the bottom/right when the map is
not a multiple) and an absolute position embedding (bilinearly resized to the input),
then its blocks. ``'sra'`` stages use mmdet's ``PVTEncoderLayer`` unchanged
(``SRABlock``: spatial-reduction attention, sr ratios 8-4-2-1); ``'circulant'`` and
``'core'`` stages use :class:`CirculantBlock` / :class:`CoreBlock` with PVT's MLP
(mmdet ``MixFFN`` without conv, MLP ratios 8-8-4-4): ``CAPVT.attention_blocks``.

Parameter names follow mmdet's ``PyramidVisionTransformer`` up to the renames of
:data:`mmcirc.models.convert.pvt.MMDET_PVT_KEY_MAP`. Circulant blocks have ``cpe``,
``norm1``, ``attn.{gate.0,qkv,proj}``, ``norm2`` and ``ffn.layers.{0,3}``; core stages
also hold the bank ``layers.{i}.cores``.
"""

from numbers import Real

from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks.transformer import PatchEmbed
from mmdet.models.backbones.pvt import AbsolutePositionEmbedding
from mmengine.model import ModuleList

from mmcirc.registry import register_model
from ..blocks import CirculantBlock, CoreBlock, SRABlock
from ..families import register_family
from .contract import is_int
from .pyramid import PyramidBackbone

__all__ = ['CAPVT', 'CorePVT']


@register_model()
@register_family
class CAPVT(PyramidBackbone):
    """PVT v1 pyramid with circulant attention in stages 1-2 (CA-PVT, METHOD.md).

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'medium'``, ``'large'`` or a dict
            with ``embed_dims`` (one width per stage), ``depths``, ``num_heads``.
        attention (str, optional): attention of the replaced stages 1-2 in the paper's
            layout, a kind of ``attention_blocks`` (``'circulant'``, ``'core'``; ``'sra'``:
            plain PVT); None: the class's ``default_attention``.
        stage_attentions (str | Sequence[str], optional): per-stage attention, each a
            kind as above; a str applies to all stages. None:
            ``(attention, attention, 'sra', 'sra')``.
        block_cfgs (dict | Sequence[dict | None], optional): per-stage block configs
            (``type`` = a registered block, other keys its arguments), see
            :class:`PyramidBackbone`.
        pretrain_img_size (int | tuple[int]): image size the position embeddings are
            stored for (224: 56x56, 28x28, 14x14, 7x7 tables, resized to any input).
        in_channels (int): image channels.
        patch_sizes (Sequence[int]): kernel = stride of each stage's patch embedding.
        sr_ratios (Sequence[int]): spatial reduction of the ``'sra'`` stages.
        mlp_ratios (Sequence[float]): MLP ratio per stage.
        qkv_bias (bool): q/k/v bias of the sra and core attentions.
        out_indices (int | Sequence[int]): stages to output (0-3, negative allowed).
        drop_rate, attn_drop_rate (float): dropouts.
        drop_path_rate (float): stochastic depth, linear from 0 over all blocks.
        use_abs_pos_embed (bool): PVT's absolute position embeddings (on).
        norm_after_stage (bool): LN at the end of every stage (mmdet PVTv2 style; off).
        circulant_heads (int | None | Sequence): heads of circulant stages; None: one
            head per channel (d=1, the paper's setting).
        boundary (str): circulant boundary, ``'circular'`` or ``'zero'``.
        scale (str | float): circulant scale, ``'sqrt_n'`` (official), ``'n'`` (paper
            Eq. 15, resolution invariant) or a positive float.
        num_cores (int | str, optional): active cores C' of core stages (an int or a
            preset, see :class:`ElasticCores`); None: num_cores_max.
        num_cores_max (int): size of the learnable core bank of each core stage.
        core_chunk_size (int, optional): patches per chunk of the core gather.
        core_cpe (bool): 3x3 depthwise CPE in core blocks (off: PVT has position
            embeddings).
        act_cfg, norm_cfg (dict): activation and norm (LN, eps 1e-6).
        frozen_stages (int): -1 none; 0 the stage-1 patch/position embedding; k >= 1
            stages 1..k entirely (requires_grad False, eval mode).
        norm_eval (bool): keep normalisation layers in eval mode while training.
        with_cp (bool): gradient checkpointing per block.
        init_cfg (dict, optional): e.g. ``dict(type='Pretrained', checkpoint=...,
            prefix='backbone.')``.
    """

    arch_zoo = {
        'tiny': dict(embed_dims=(64, 128, 320, 512), depths=(2, 2, 2, 2), num_heads=(1, 2, 5, 8)),
        'small': dict(embed_dims=(64, 128, 320, 512), depths=(3, 4, 6, 3), num_heads=(1, 2, 5, 8)),
        'medium': dict(
            embed_dims=(64, 128, 320, 512), depths=(3, 4, 18, 3), num_heads=(1, 2, 5, 8)
        ),
        'large': dict(embed_dims=(64, 128, 320, 512), depths=(3, 8, 27, 3), num_heads=(1, 2, 5, 8)),
    }
    family = 'pvt'
    attention_blocks = dict(circulant=CirculantBlock, core=CoreBlock, sra=SRABlock)
    original_attention = 'sra'
    ffn_type = 'mixffn'
    default_attention = 'circulant'
    stages_attr = 'layers'
    conv_init = 'fan_out'

    def __init__(
        self,
        arch='tiny',
        attention=None,
        stage_attentions=None,
        pretrain_img_size=224,
        in_channels=3,
        patch_sizes=(4, 2, 2, 2),
        sr_ratios=(8, 4, 2, 1),
        mlp_ratios=(8, 8, 4, 4),
        qkv_bias=True,
        out_indices=(0, 1, 2, 3),
        drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.1,
        use_abs_pos_embed=True,
        norm_after_stage=False,
        circulant_heads=None,
        boundary='circular',
        scale='sqrt_n',
        num_cores=None,
        num_cores_max=64,
        core_chunk_size=None,
        core_cpe=False,
        act_cfg=dict(type='GELU'),
        norm_cfg=dict(type='LN', eps=1e-6),
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
        patch_sizes = self._per_stage('patch_sizes', patch_sizes, n, lambda v: is_int(v) and v >= 1)
        sr_ratios = self._per_stage('sr_ratios', sr_ratios, n, lambda v: is_int(v) and v >= 1)
        mlp_ratios = self._per_stage(
            'mlp_ratios',
            mlp_ratios,
            n,
            lambda v: isinstance(v, Real) and not isinstance(v, bool) and v > 0,
        )
        if is_int(pretrain_img_size):
            pretrain_img_size = (pretrain_img_size, pretrain_img_size)
        if (
            not isinstance(pretrain_img_size, (tuple, list))
            or len(pretrain_img_size) != 2
            or not all(is_int(v) and v >= 1 for v in pretrain_img_size)
        ):
            raise ValueError(
                f'CAPVT: pretrain_img_size must be a positive int or (H, W), '
                f'got {pretrain_img_size!r}'
            )
        self.use_abs_pos_embed = use_abs_pos_embed

        self.layers = ModuleList()
        stride = 1
        for i in range(n):
            dims = self.embed_dims[i]
            stride *= patch_sizes[i]
            patch_embed = PatchEmbed(
                in_channels=in_channels if i == 0 else self.embed_dims[i - 1],
                embed_dims=dims,
                kernel_size=patch_sizes[i],
                stride=patch_sizes[i],
                padding='corner',
                bias=True,
                norm_cfg=norm_cfg,
            )
            pos_shape = (
                max(pretrain_img_size[0] // stride, 1),
                max(pretrain_img_size[1] // stride, 1),
            )
            pos_embed = (
                AbsolutePositionEmbedding(pos_shape=pos_shape, pos_dim=dims, drop_rate=drop_rate)
                if use_abs_pos_embed
                else None
            )
            own = dict(  # the SRA block's (besides the MLP's)
                num_heads=self.num_heads[i],
                qkv_bias=qkv_bias,
                attn_drop_rate=attn_drop_rate,
                sr_ratio=sr_ratios[i],
            )
            norm = build_norm_layer(norm_cfg, dims)[1] if norm_after_stage else None
            parts = dict(patch_embed=patch_embed, pos_embed=pos_embed, norm=norm)
            blocks = self._build_blocks(i, mlp_ratios[i], own)
            self.layers.append(self._build_stage(i, blocks, **parts))
        self._finish()

    def _stem_modules(self):
        first = self.layers[0]
        return [m for m in (first.patch_embed, first.pos_embed) if m is not None]


@register_model()
@register_family
class CorePVT(CAPVT):
    """:class:`CAPVT` with core attention in stages 1-2 by default (``attention='core'``)."""

    default_attention = 'core'
