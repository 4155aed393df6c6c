"""The isotropic families as timm models: CA-DeiT (:class:`CADeiTTimm`) and VECA
(:class:`VECATimm`), on :class:`~mmcirc.timm.model.TimmModel`.

The backbone returns the raw output of every block (``out_type='raw'``); the final norm
(and VECA's output projection) is applied here, to the last block's output for
:meth:`forward_features` and, with ``norm=True``, to the taps of
:meth:`forward_intermediates`. Torch and timm only.
"""

import functools

import torch
from torch import nn

from .model import TimmModel, building_on, init_backbone

__all__ = ['CADeiTTimm', 'VECATimm']


def block_map(tokens: torch.Tensor, x: torch.Tensor, patch_size: int, prefix: int) -> torch.Tensor:
    """A block's output ``tokens`` (B, prefix + N, C) for an image x (B, C_in, H, W) ->
    the (B, C, H', W') map of its N patch tokens (H' = ceil(H / patch_size))."""
    b, _, c = tokens.shape
    hw = -(-x.shape[-2] // patch_size), -(-x.shape[-1] // patch_size)
    return tokens[:, prefix:].transpose(1, 2).reshape(b, c, *hw)


class _Isotropic(TimmModel):
    """Shared by CA-DeiT and VECA: the backbone returns every block's output."""

    output_fmt = 'NLC'

    def __init__(self, backbone_cfg, num_classes, global_pool, drop_rate, in_chans, device, dtype):
        """The family's backbone built on ``device`` with ``backbone_cfg`` (its keyword
        arguments), returning every block's raw output; the timm arguments as named."""
        with building_on(device):
            backbone = self.backbone_class()(in_channels=in_chans, out_type='raw', **backbone_cfg)
            init_backbone(backbone)
            backbone.out_indices = tuple(range(backbone.num_stages))  # every block's output
        dims, stride = backbone.embed_dims, backbone.patch_size
        info = [
            dict(num_chs=dims, reduction=stride, module=f'backbone.blocks.{i}')
            for i in range(backbone.num_stages)
        ]
        super().__init__(
            backbone,
            backbone.num_features,
            info,
            num_classes,
            global_pool,
            drop_rate,
            in_chans,
            dtype,
        )
        self.patch_size = backbone.patch_size
        self.arch = backbone_cfg['arch']

    #: the key of the backbone's arch holding the block count
    depth_key = ''

    @classmethod
    def depth_of(cls, arch) -> int:
        """The block count of ``arch`` (a name or a dict; 12 when it is neither: the
        backbone then says what is wrong)."""
        zoo = cls.backbone_class().arch_zoo
        settings = zoo.get(arch.lower()) if isinstance(arch, str) else arch
        return int(settings.get(cls.depth_key, 12)) if isinstance(settings, dict) else 12

    @classmethod
    def backbone_class(cls):
        """The mmcirc backbone class of the family (:data:`~mmcirc.models.families.FAMILIES`
        by ``released_kind``; imported when used)."""
        import mmcirc.models.backbones  # noqa: F401  (adds the backbones to the table)
        from mmcirc.models.families import FAMILIES

        return FAMILIES[cls.released_kind].classes[0]

    def _final(self, outs) -> torch.Tensor:
        """The backbone's block outputs ``outs`` -> :meth:`forward_features`' result."""
        raise NotImplementedError

    #: tokens ahead of the patches in a block's output (VECA: the cores)
    block_prefix = 0

    @staticmethod
    def fx_leaves():
        from mmcirc.models.backbones.contract import pad_to_multiple

        return (), (pad_to_multiple,)

    def feature_map_fn(self):
        """A block's output tokens -> its patches' map (:func:`block_map`)."""
        return functools.partial(block_map, patch_size=self.patch_size, prefix=self.block_prefix)

    def _block_tokens(self, outs, i: int, norm: bool) -> torch.Tensor:
        """Block ``i``'s patch tokens (B, N, C) of the outputs ``outs``, raw or through
        the final LN (``norm``)."""
        raise NotImplementedError

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C_in, H, W) -> the final features (see the family's docstring)."""
        return self._final(self.backbone(x))

    def _intermediates(self, x, indices, norm, output_fmt):
        """The patch tokens of the blocks (``norm``: through the final LN) as (B, C, H', W')
        maps or (B, N, C) tokens (``output_fmt``)."""
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, outs = self._check_indices(indices), self.backbone(x)  # one output per block
        inter = [self._block_tokens(outs, i, norm) for i in take]  # (B, N, C)
        if output_fmt == 'NCHW':
            inter = [block_map(t, x, self.patch_size, 0) for t in inter]  # (B, C, H', W')
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
    the backbone's (attention projection and MLP), ``drop_path_rate`` stochastic depth;
    ``device`` and ``dtype`` of the parameters. Other keyword arguments go to the
    backbone (``patch_size``, ``boundary``, ``scale``, ``circulant_heads``, ...).
    """

    pool_types = ('avg', '')
    released_kind = 'deit'
    depth_key = 'depth'
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
        device=None,
        dtype=None,
        **backbone_kwargs,
    ):
        backbone_cfg = dict(
            arch=arch,
            final_norm=False,  # the final LN is applied here (intermediates stay raw)
            drop_rate=proj_drop_rate,
            drop_path_rate=drop_path_rate,
            **backbone_kwargs,
        )
        super().__init__(backbone_cfg, num_classes, global_pool, drop_rate, in_chans, device, dtype)

    @staticmethod
    def fx_leaves():
        from mmcirc.ops.circulant import CirculantAttention

        modules, functions = _Isotropic.fx_leaves()
        return (*modules, CirculantAttention), functions

    def _final(self, outs) -> torch.Tensor:
        """One (B, N, C) per block -> the final-LN tokens (B, N, C), N = ceil(H/p) * ceil(W/p)."""
        return self.backbone.norm(outs[-1])

    def _block_tokens(self, outs, i: int, norm: bool) -> torch.Tensor:
        return self.backbone.norm(outs[i]) if norm else outs[i]

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1) if self.global_pool == 'avg' else x  # (B, C) | (B, N, C)

    def _prune(self, keep: int, prune_norm: bool) -> int:
        del self.backbone.blocks[keep:]
        self.backbone.depth = keep
        if prune_norm:
            self.backbone.norm = nn.Identity()
        return self.backbone.embed_dims


class VECATimm(_Isotropic):
    """VECA (:class:`~mmcirc.models.backbones.VECAViT`) as a timm model.

    ``forward_features``: the final sequence ``[cores; patches]`` (B, C' + N, D) through
    the final LN and output projection (the first ``num_prefix_tokens`` = C' are the
    cores); ``global_pool='token'`` (the global token, the first core: the official
    feature), ``'avg'`` (the mean of the patches) or ``''``. ``num_cores`` (C', an int
    multiple of 8 or a preset name) is an option, changed later with
    :meth:`set_num_cores`. Any H x W. ``drop_rate`` is the head dropout,
    ``proj_drop_rate`` the backbone's (the official ``dropout``); ``device`` and
    ``dtype`` of the parameters. Other keyword arguments go to the backbone
    (``patch_size``, the RoPE settings, ``out_channels``, ...).
    """

    pool_types = ('token', 'avg', '')
    released_kind = 'veca'
    depth_key = 'num_layers'
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
        device=None,
        dtype=None,
        **backbone_kwargs,
    ):
        backbone_cfg = dict(
            arch=arch,
            num_cores=num_cores,
            out_norm=False,  # the final LN and projection are applied here
            dropout=proj_drop_rate,
            **backbone_kwargs,
        )
        super().__init__(backbone_cfg, num_classes, global_pool, drop_rate, in_chans, device, dtype)
        self.backbone_kwargs = dict(backbone_kwargs)

    @property
    def num_prefix_tokens(self) -> int:
        """The cores C' ahead of the patches in :meth:`forward_features`' sequence and in
        a block's output (``block_prefix``)."""
        return self.backbone.num_cores

    block_prefix = num_prefix_tokens

    def set_num_cores(self, num_cores) -> None:
        """The active core count C' (:meth:`VECAViT.set_num_cores`)."""
        self.backbone.set_num_cores(num_cores)

    def _final(self, outs) -> torch.Tensor:
        """One (cores, patches) per block -> the final sequence (B, C' + N, D_out)."""
        cores, patches = outs[-1]  # (B, C', D), (B, N, D)
        x = torch.cat([cores, patches], dim=1)  # (B, C' + N, D)
        return self.backbone.output_proj(self.backbone.final_norm(x))

    def _block_tokens(self, outs, i: int, norm: bool) -> torch.Tensor:
        patches = outs[i][1]  # (B, N, D)
        return self.backbone.final_norm(patches) if norm else patches

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        if self.global_pool == 'token':
            return x[:, 0]  # (B, D): the global token
        if self.global_pool == 'avg':
            return x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, D): mean of the patches
        return x

    def _prune(self, keep: int, prune_norm: bool) -> int:
        bb = self.backbone
        del bb.blocks[keep:]
        bb.num_layers = keep
        del bb.pos_linears[keep - 1 :]  # block i > 0 moves the cores with pos_linears[i - 1]
        alpha = bb.pos_alpha
        bb.pos_alpha = (
            nn.Parameter(alpha.detach()[: keep - 1].clone(), requires_grad=alpha.requires_grad)
            if keep > 1
            else None
        )
        if prune_norm:
            self.backbone.final_norm = nn.Identity()
            self.backbone.output_proj = nn.Identity()
            return self.backbone.embed_dims
        return self.backbone.num_features
