"""A block's MLP over chunks of tokens in CPU inference (:class:`~.pyramid_blocks.TokenFFN`,
:class:`~.pyramid_blocks.TokenMixFFN`): the same per-token products as one call, so the
same result, with the hidden layer of a chunk kept in the cache instead of a whole
(N, C_hidden) tensor (2 GB for a 1024 x 1024 map at 512, and GELU's output another 2 GB).
"""

from typing import Optional

import torch
import torch.nn as nn
from mmdet.models.backbones.pvt import MixFFN

from mmcirc.ops.settings import autocast_dtype, cpu_layout, graph_capture

__all__ = ['FFN_CHUNK_TOKENS', 'chunkable', 'mlp_chunked']

#: tokens per chunk of a block's MLP in inference (4096 x C_hidden floats, 8 MB at 512)
FFN_CHUNK_TOKENS = 4096


def chunkable(ffn: nn.Module, x: torch.Tensor) -> bool:
    """Whether the MLP ``ffn`` may run over chunks of the tokens x (B, N, C): inference
    (no autograd, eval mode: DropPath and dropout are identities), eager (not traced,
    compiled or exported: graphs keep one symbolic-size product), a plain tensor (a
    row-banded map of :mod:`mmcirc.distributed` is no run of whole rows once cut into
    chunks) in the CPU layout (:mod:`mmcirc.ops.settings`: on a GPU chunks only multiply
    the kernels launched); the caller has seen more tokens than one chunk."""
    return (
        type(x) is torch.Tensor
        and not (torch.is_grad_enabled() or ffn.training)
        and not graph_capture()
        and cpu_layout(x)
    )


def _mlp_steps(ffn: nn.Module) -> Optional[list]:
    """The per-token MLP of an eval-mode :class:`~.pyramid_blocks.TokenMixFFN` (1x1 convs)
    or :class:`~.pyramid_blocks.TokenFFN` (as :func:`~.pyramid_blocks.build_ffn` makes
    them) as a list of steps for :func:`_mlp_into`: ``(weight (out, in), bias)`` for each
    linear / conv, the module for each GELU / ReLU; dropouts (identities in eval) left
    out. None for another activation."""
    layers = ffn.layers if isinstance(ffn, MixFFN) else [*ffn.layers[0], *ffn.layers[1:]]
    steps = []
    for m in layers:
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            steps.append((m.weight.flatten(1), m.bias))
        elif isinstance(m, (nn.GELU, nn.ReLU)):
            steps.append(m)
        elif not isinstance(m, nn.Dropout):
            return None
    return steps


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
                elif isinstance(s, nn.ReLU):
                    h.relu_()
                else:  # weight (C_out, C_in), bias (C_out,) into the buffer's (n, C_out)
                    h = torch.addmm(s[1], h, s[0].t(), out=buf[: h.shape[0]])
            torch.add(identity[b, a : a + k], h, out=out[b, a : a + k])  # (n, C)
    return out


def mlp_chunked(ffn: nn.Module, x: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
    """``identity + MLP(x)`` of a :func:`chunkable` call, written into one output (B, N, C):
    by :func:`_mlp_into` when the MLP is GEMMs and activations in float32, else by the
    module on each chunk of :data:`FFN_CHUNK_TOKENS` tokens."""
    out = torch.empty_like(identity)  # (B, N, C)
    steps = None if autocast_dtype(x.device.type) is not None else _mlp_steps(ffn)
    if steps is not None:
        return _mlp_into(steps, x, identity, out)
    for a in range(0, x.shape[1], FFN_CHUNK_TOKENS):
        b = a + FFN_CHUNK_TOKENS
        out[:, a:b] = ffn(x[:, a:b], identity[:, a:b])  # (B, n, C): one chunk, one call
    return out
