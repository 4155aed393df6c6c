"""What every pyramid block declares, and the registry queries built on it.

A block is a module ``blk(x, hw_shape) -> x`` (tokens (B, N, C) of an H x W map) or,
when it ``carries_cores``, ``blk(x, hw_shape, cores) -> (x, cores)``. It is registered
in the MODELS registries of mmdet, mmseg and mmpretrain (:func:`mmcirc.registry.
register_model`) and declares, as class attributes:

* ``kind``: the short name used in a backbone's ``attention`` / ``stage_attentions``;
* ``carries_cores``: the stage owns a core bank whose cores go through the blocks;
* ``families``: the pyramid families it fits (None: any, e.g. ``('pvt', )``);
* ``added_keys``: state-dict key prefixes (relative to the block) that the family's
  original block does not have, i.e. what a converted checkpoint leaves new;
* ``options``: the backbone-level options it reads (e.g. ``boundary``), so a tool
  can tell whether an option has any effect;
* ``quadratic``: its attention matrix grows with the square of the map area;
* ``attention_probes``: how the analysis captures its attention and counts its FLOPs
  (:class:`~mmcirc.models.blocks.probe.AttentionProbe`; the probes of all registered
  blocks are asked, so a probe also finds its operator outside this block);
* ``fx_leaves``: the module classes inside it whose forward branches on sizes or makes
  them ints, which ``torch.fx`` records whole instead of tracing (mmcirc.timm).

A backbone builds its blocks from configs: :meth:`PyramidBlock.stage_kwargs` maps the
backbone's per-block context (``embed_dims``, ``num_heads``, ``drop_path_rate``, ...)
to constructor arguments; a block config (``dict(type='CirculantBlock', boundary=
'zero')``) adds or overrides arguments. Which kinds exist, and which a family takes, is
read from the registry (:func:`block_classes`), never from a hand-kept list.
"""

import inspect
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks.drop import DropPath
from mmcv.cnn.bricks.transformer import FFN
from mmdet.models.backbones.pvt import MixFFN

from mmcirc.ops.capture import graph_capture
from mmcirc.ops.circulant import autocast_dtype
from mmcirc.ops.layout import cpu_layout

__all__ = [
    'PyramidBlock',
    'block_classes',
    'block_class',
    'attention_kinds',
    'FFN_TYPES',
    'FFN_CHUNK_TOKENS',
    'apply_ffn',
    'build_ffn',
    'cpe',
    'map_as_tokens',
    'mixffn_tokens',
    'tokens_as_map',
]

FFN_TYPES = ('ffn', 'mixffn')
#: tokens per chunk of a block's MLP in inference (no autograd, eval mode): the hidden
#: layer of a chunk (4096 x C_hidden floats, 8 MB at 512) stays in the cache instead of
#: making a whole (N, C_hidden) tensor (2 GB for a 1024 x 1024 map at 512, and GELU's
#: output another 2 GB); the same per-token products, so the same result
FFN_CHUNK_TOKENS = 4096


class PyramidBlock:
    """Mixin of the declarations above (see the module docstring)."""

    kind: str = ''
    carries_cores: bool = False
    families: Optional[Tuple[str, ...]] = None
    added_keys: Tuple[str, ...] = ()
    options: Tuple[str, ...] = ()
    quadratic: bool = False
    attention_probes: tuple = ()
    fx_leaves: tuple = ()
    #: the family's ``num_heads`` must divide ``embed_dims`` in a stage of this kind
    uses_num_heads: bool = True

    @classmethod
    def fits(cls, family: Optional[str]) -> bool:
        """Whether this block may be used in a pyramid of ``family``."""
        return cls.families is None or family in cls.families

    @classmethod
    def stage_kwargs(cls, ctx: dict) -> dict:
        """Constructor arguments from the backbone's context of one block (default:
        the context entries the constructor names)."""
        params = inspect.signature(cls.__init__).parameters
        return {k: v for k, v in ctx.items() if k in params and k != 'self'}

    @classmethod
    def check_stage(cls, owner: str, i: int, ctx: dict) -> None:
        """Raise ValueError when stage ``i`` of backbone ``owner`` cannot hold this block."""
        dims, heads = ctx['embed_dims'], ctx['num_heads']
        if cls.uses_num_heads and dims % heads:
            raise ValueError(
                f'{owner}: num_heads[{i}]={heads} must divide embed_dims[{i}]={dims} '
                f'(stage {i} uses {cls.kind!r} attention)'
            )

    def added_state_keys(self) -> List[str]:
        """This block's state-dict keys that the family's original block lacks."""
        return [k for k in self.state_dict() if k.startswith(tuple(self.added_keys))]

    def attention_matrix(self, hw: Sequence[int]) -> Optional[dict]:
        """Size of the materialised attention matrix on an (h, w) map:
        ``dict(queries, keys, heads)``, or None when there is none."""
        return None


def block_classes(family: Optional[str] = None) -> Dict[str, type]:
    """``{kind: class}`` of the registered blocks (that fit ``family`` if given), in
    registration order. Raises ValueError if two registered blocks claim one kind."""
    from mmcirc.registry import model_registries

    out = {}
    for cls in list(model_registries()[0].module_dict.values()):
        if not (inspect.isclass(cls) and issubclass(cls, PyramidBlock) and cls.kind):
            continue
        if family is not None and not cls.fits(family):
            continue
        if cls.kind in out and out[cls.kind] is not cls:
            raise ValueError(
                f'two registered blocks claim attention kind {cls.kind!r}: '
                f'{out[cls.kind].__name__} and {cls.__name__}'
            )
        out[cls.kind] = cls
    return out


def attention_kinds(family: Optional[str] = None) -> Tuple[str, ...]:
    """The attention kinds of the registered blocks (that fit ``family``)."""
    return tuple(block_classes(family))


def block_class(name: str, family: Optional[str] = None) -> type:
    """The registered block of kind ``name`` or class name ``name`` (ValueError if
    none fits ``family``)."""
    from mmcirc.registry import model_registries

    kinds = block_classes(family)
    if name in kinds:
        return kinds[name]
    cls = model_registries()[0].module_dict.get(name)
    if inspect.isclass(cls) and issubclass(cls, PyramidBlock) and cls.kind in kinds:
        return cls
    raise ValueError(
        f'block type must be a registered block (kinds {tuple(kinds)}, classes '
        f'{tuple(c.__name__ for c in kinds.values())}), got {name!r}'
    )


# --------------------------------------------------------------------------- helpers
def tokens_as_map(x: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
    """Tokens (B, N, C) of an H x W map as a (B, C, H, W) view in channels-last memory
    (no copy): a convolution keeps that memory format, so its output goes back to
    tokens with :func:`map_as_tokens` as a view too."""
    b, _, c = x.shape
    return x.reshape(b, hw_shape[0], hw_shape[1], c).permute(0, 3, 1, 2)  # (B, C, H, W) view


def map_as_tokens(x: torch.Tensor) -> torch.Tensor:
    """A (B, C, H, W) map as tokens (B, N, C): a view when the map is channels-last
    (otherwise the one copy that makes the tokens contiguous)."""
    b, c = x.shape[:2]
    return x.permute(0, 2, 3, 1).reshape(b, -1, c)  # (B, N, C)


def cpe(conv: nn.Conv2d, x: torch.Tensor, hw_shape: Sequence[int]) -> torch.Tensor:
    """Depthwise 3x3 conv (conditional positional encoding) of tokens (B, N, C), run on
    the channels-last view of the tokens: no layout copy either way."""
    return map_as_tokens(conv(tokens_as_map(x, hw_shape)))  # (B, N, C)


def build_ffn(
    ffn_type: str,
    embed_dims: int,
    feedforward_channels: int,
    drop_rate: float,
    drop_path_rate: float,
    act_cfg: dict,
) -> nn.Module:
    """The MLP of a block, as the family writes it: mmcv ``FFN`` (Swin, keys
    ``ffn.layers.0.0`` / ``ffn.layers.1``) or mmdet's ``MixFFN`` without its depthwise
    conv (PVT, 1x1 convs, keys ``ffn.layers.0`` / ``ffn.layers.3``)."""
    dropout_layer = dict(type='DropPath', drop_prob=drop_path_rate)
    if ffn_type == 'ffn':
        return FFN(
            embed_dims=embed_dims,
            feedforward_channels=feedforward_channels,
            num_fcs=2,
            ffn_drop=drop_rate,
            dropout_layer=dropout_layer,
            act_cfg=act_cfg,
            add_identity=True,
        )
    if ffn_type == 'mixffn':
        return MixFFN(
            embed_dims=embed_dims,
            feedforward_channels=feedforward_channels,
            act_cfg=act_cfg,
            ffn_drop=drop_rate,
            dropout_layer=dropout_layer,
            use_conv=False,
        )
    raise ValueError(f'ffn_type must be one of {FFN_TYPES}, got {ffn_type!r}')


def _pointwise_conv(m: nn.Module) -> bool:
    """Whether ``m`` is a 1x1 convolution that is a linear map of each pixel's channels."""
    return (
        isinstance(m, nn.Conv2d)
        and m.kernel_size == (1, 1)
        and m.stride == (1, 1)
        and m.padding == (0, 0)
        and m.dilation == (1, 1)
        and m.groups == 1
        and m.padding_mode == 'zeros'
    )


def mixffn_tokens(ffn: MixFFN, x: torch.Tensor) -> torch.Tensor:
    """``MixFFN.layers`` without its depthwise conv, run on tokens (B, N, C): each 1x1
    conv as the GEMM ``F.linear`` with the conv's own weight (out, in, 1, 1) viewed
    (out, in), the activation and dropouts elementwise, so no (B, C, H, W) layout
    is made. Returns the MLP output (B, N, C) (no residual, no DropPath)."""
    for layer in ffn.layers:
        if _pointwise_conv(layer):
            x = F.linear(x, layer.weight.flatten(1), layer.bias)  # (B, N, C_out)
        else:
            x = layer(x)  # activation / dropout: elementwise
    return x


def _chunkable(ffn: nn.Module, x: torch.Tensor) -> bool:
    """Whether the MLP may run over chunks of tokens: inference (no autograd, eval mode:
    DropPath and dropout are identities), eager (not traced, compiled or exported:
    graphs keep one symbolic-size product), a plain tensor (a row-banded map of
    :mod:`mmcirc.distributed` is no run of whole rows once cut into chunks) in the CPU
    layout (:mod:`mmcirc.ops.layout`: on a GPU chunks only multiply the kernels
    launched) and more tokens than one chunk."""
    n = x.shape[1]
    return (
        type(x) is torch.Tensor
        and cpu_layout(x)
        and not (torch.is_grad_enabled() or ffn.training)
        and not graph_capture()
        and isinstance(n, int)
        and n > FFN_CHUNK_TOKENS
    )


def _mlp_steps(ffn: nn.Module) -> Optional[list]:
    """The per-token MLP of an eval-mode ``ffn`` (mmdet's ``MixFFN`` without its 3x3 conv,
    or mmcv's ``FFN`` adding its identity, no layer scale) as a list of steps for
    :func:`_mlp_into`: ``(weight (out, in), bias)`` for each linear / 1x1 conv, the
    module for each GELU / ReLU; dropouts (identities in eval) left out. None when it
    holds anything else or does not start with a GEMM."""
    if isinstance(ffn, MixFFN):
        mods = list(ffn.layers)
    elif (
        isinstance(ffn, FFN)
        and ffn.add_identity
        and isinstance(getattr(ffn, 'gamma2', nn.Identity()), nn.Identity)
    ):
        mods = [
            m
            for layer in ffn.layers
            for m in (layer if isinstance(layer, nn.Sequential) else [layer])
        ]
    else:
        return None
    if not isinstance(ffn.dropout_layer, (nn.Identity, nn.Dropout, DropPath)):
        return None
    steps = []
    for m in mods:
        if isinstance(m, nn.Linear) or _pointwise_conv(m):
            steps.append((m.weight.flatten(1), m.bias))
        elif isinstance(m, (nn.GELU, nn.ReLU)) and steps:
            steps.append(m)
        elif not isinstance(m, (nn.Dropout, nn.Identity)):
            return None
    return steps if steps and isinstance(steps[0], tuple) else None


def _mlp_into(steps, x: torch.Tensor, identity: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = identity + MLP(x)`` over chunks of :data:`FFN_CHUNK_TOKENS` tokens, each
    GEMM writing into one (chunk, C_out) buffer made once and each activation in place:
    the ops of ``F.linear`` and the modules' forwards, in their order, so the same
    result, without a fresh hidden tensor per chunk (glibc hands such a block back and
    the next chunk faults its pages in again, which dominates the MLP's profile at high
    resolution)."""
    k = FFN_CHUNK_TOKENS
    bufs = [x.new_empty(k, s[0].shape[0]) if isinstance(s, tuple) else None for s in steps]
    for b in range(x.shape[0]):
        for a in range(0, x.shape[1], k):
            h = x[b, a : a + k]  # (n, C)
            for s, buf in zip(steps, bufs):
                if isinstance(s, nn.GELU):  # activations in place on the last GEMM's buffer
                    torch.ops.aten.gelu_(h, approximate=s.approximate)
                    continue
                if isinstance(s, nn.ReLU):
                    h.relu_()
                    continue
                w, bias = s  # (C_out, C_in), (C_out,)
                o = buf[: h.shape[0]]  # (n, C_out)
                h = (
                    torch.mm(h, w.t(), out=o)
                    if bias is None
                    else torch.addmm(bias, h, w.t(), out=o)
                )
            torch.add(identity[b, a : a + k], h, out=out[b, a : a + k])  # (n, C)
    return out


def apply_ffn(
    ffn: nn.Module, x_norm: torch.Tensor, hw_shape, identity: torch.Tensor
) -> torch.Tensor:
    """``identity + DropPath(MLP(x_norm))`` for either FFN flavour; mmdet's ``MixFFN``
    without its depthwise conv runs on the tokens as GEMMs (:func:`mixffn_tokens`, the
    same parameters and keys), with one (its 3x3 conv) as mmdet wrote it. The
    per-token MLPs run over chunks of :data:`FFN_CHUNK_TOKENS` tokens in inference
    (:func:`_chunkable`), written into one output."""
    if isinstance(ffn, MixFFN):
        if not all(_pointwise_conv(m) or not isinstance(m, nn.Conv2d) for m in ffn.layers):
            return ffn(x_norm, hw_shape, identity=identity)  # its 3x3 conv: not per token

        def mlp(xs, ids):
            return ids + ffn.dropout_layer(mixffn_tokens(ffn, xs))  # (B, n, C)

    else:

        def mlp(xs, ids):
            return ffn(xs, identity=ids)  # (B, n, C)

    if not _chunkable(ffn, x_norm):
        return mlp(x_norm, identity)
    out = torch.empty_like(identity)  # (B, N, C)
    steps = None if autocast_dtype(x_norm.device.type) is not None else _mlp_steps(ffn)
    if steps is not None:
        return _mlp_into(steps, x_norm, identity, out)
    for a in range(0, x_norm.shape[1], FFN_CHUNK_TOKENS):
        b = a + FFN_CHUNK_TOKENS
        out[:, a:b] = mlp(x_norm[:, a:b], identity[:, a:b])  # (B, n, C)
    return out
