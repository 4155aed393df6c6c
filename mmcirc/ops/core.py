"""Core attention (METHOD.md section 2; VECA, Song et al., arXiv 2605.12491).

C' active core tokens c (B, C', C) are the only channel between the N patches
x (B, N, C); patches never attend to each other. Sequential form::

    gather:    g  = MHA(query = c W_qc, key = x W_kp, value = x W_vp)   O(C' N)
               c' = c + W_oc g                 (cores are a residual stream)
    broadcast: x' = MHA(query = x W_qp, key = c' W_kc, value = c' W_vc) O(N C')
    output:    y  = W_o x' + b_o,  and c' goes on to the next layer

Both MHAs are ordinary scaled dot-product attention, scale 1/sqrt(head width). The
gather has its own output projection W_oc, and the cores are a residual stream
(c' = c + ...), so a core keeps its identity across layers (the block decides about
norms). Key projections carry no bias: a key bias adds q . b_k to every score of a
query, which the softmax cancels, so it would be a parameter without gradient.

Two exact evaluation orders (``fold_projections``):

* unfolded: project the patches (``x W_kp``, ``x W_vp``, ``x W_qp``) and attend, cost
  ~ N C^2 (projections) + N C' C (attention).
* folded: move the patch-side projections onto the C' cores, which are few:
  ``(c W_qc)_h . (W_kp x)_h = ((c W_qc)_h W_kp,h) . x`` and
  ``sum_n p_n (W_vp x_n + b) = W_vp (sum_n p_n x_n) + b sum_n p_n`` in the gather;
  ``(W_qp x + b)_h . k_h = x . (W_qp,h^T k_h) + b_h . k_h`` and
  ``W_o concat_h(P_h v_h) = sum_h P_h (v_h W_o,h^T)`` in the broadcast. The patches are
  then never projected: cost ~ N C' C * heads, all of it proportional to C' (elastic
  inference really pays off).

Auto choice: fold when ``heads * C' < C + C'`` (fewer multiply-adds).

With one head and no autograd the folded broadcast ``softmax(x k_t^T + beta) v_t`` is
one fused ``scaled_dot_product_attention`` (``beta`` its additive mask): no (B, N, C')
scores are stored, so a call allocates little more than its output. Otherwise (more
heads; autograd, where the fused kernel's mask gradient is slower) it is two GEMMs around
a softmax per head (:mod:`.core_softmax`). Under bf16 / fp16 autocast the softmaxes and
the online gather's running sums are float32; the projections and products follow autocast.

Unchunked, the gather is one fused ``scaled_dot_product_attention`` call (no (heads, C',
N) score map is stored). Bounded memory: for N > ``chunk_threshold`` (or any N when
``chunk_size`` is set) the gather streams over chunks of patches with an online
(log-sum-exp) softmax (running max, running denominator, running weighted sum),
projecting each chunk's keys/values inside the loop, and the broadcast runs per chunk of
queries. The result equals the unchunked one; with autograd on, each chunk is
checkpointed so that its scores are recomputed in backward, not stored.

This file depends on torch only.
"""

from numbers import Integral
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .core_softmax import Scores, core_softmax, pad_keys, wide
from .settings import autocast_dtype, cached_plan, current, graph_capture

__all__ = [
    'CORE_PRESETS',
    'CoreAttention',
    'CorePlan',
    'check_positive',
    'parse_num_cores',
    'select_cores',
]

#: Named active core counts C' (elastic inference), shared by every model with cores.
CORE_PRESETS = {'mobile': 8, 'edge': 32, 'server': 64}

DEFAULT_CHUNK_THRESHOLD = 1 << 17  # 131072 tokens, e.g. 362 x 362
DEFAULT_CHUNK_SIZE = 1 << 14  # patches per chunk once chunking is on


def check_positive(name, value, allow_none=False):
    """ValueError naming ``name`` unless ``value`` is a positive int (or None with
    ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f'{name} must be a positive int{" or None" if allow_none else ""}, got {value!r}'
        )


def parse_num_cores(value, maximum=None, step=1, name='num_cores'):
    """The one parser of an active core count C': an int, a string of digits (as a
    command line gives it) or a preset name of :data:`CORE_PRESETS`; returns the int.

    ``maximum``: the bank size (None: any positive count); ``step``: C' must be a
    multiple of it (a model whose bank comes in chunks). A ``ValueError`` starts with
    ``name`` and lists the allowed values."""
    n = value
    if isinstance(n, str):
        n = CORE_PRESETS.get(n, int(n) if n.strip().isdigit() else None)
    ok = isinstance(n, Integral) and not isinstance(n, bool) and n >= step and n % step == 0
    ok = ok and (maximum is None or n <= maximum)
    if not ok:
        upper = 'num_cores_max' if maximum is None else f'num_cores_max={maximum}'
        multiple = f' and a multiple of {step}' if step > 1 else ''
        raise ValueError(
            f'{name} must be an int in [{step}, {upper}]{multiple} or a preset in '
            f'{tuple(CORE_PRESETS)} {CORE_PRESETS}, got {value!r}'
        )
    return int(n)


def select_cores(bank, num_cores, batch_size=None):
    """Active prefix of a (C_max, C) core bank (elastic inference): ``bank[:num_cores]``,
    1 <= C' <= C_max, a view (C', C), or expanded to (B, C', C) with ``batch_size``."""
    if not isinstance(bank, torch.Tensor) or bank.dim() != 2:
        raise ValueError(
            f'bank must be a 2-D tensor (C_max, C), got {getattr(bank, "shape", type(bank))}'
        )
    is_int = isinstance(num_cores, int) and not isinstance(num_cores, bool)
    if not is_int or not 1 <= num_cores <= bank.shape[0]:
        raise ValueError(
            f'num_cores must be an int in [1, {bank.shape[0]}] (the bank size), got {num_cores!r}'
        )
    check_positive('batch_size', batch_size, allow_none=True)
    cores = bank[:num_cores]
    if batch_size is None:
        return cores
    return cores.unsqueeze(0).expand(batch_size, -1, -1)


class CorePlan(NamedTuple):
    """What a :class:`CoreAttention` forward decides once per input shape."""

    chunk: int  #: patches per chunk (N: unchunked)
    fold: bool  #: the folded evaluation order


class CoreAttention(nn.Module):
    """Core attention: gather into C' cores, broadcast back to the patches.

    Args:
        dim (int): channels C of patches and cores.
        num_heads (int): heads of both MHAs (head width C / num_heads).
        qkv_bias (bool): bias of the query and value projections (keys have none).
        attn_drop (float): dropout on the attention probabilities.
        proj_drop (float): dropout after the patch output projection.
        chunk_size (int, optional): patches per chunk; set it to always chunk.
        chunk_threshold (int): with ``chunk_size=None``, chunk only when N exceeds
            this, in chunks of min(``DEFAULT_CHUNK_SIZE``, threshold).
        fold_projections (bool, optional): evaluation order (both exact); None picks
            the cheaper one for the given C'.
    """

    def __init__(
        self,
        dim,
        num_heads,
        qkv_bias=True,
        attn_drop=0.0,
        proj_drop=0.0,
        chunk_size=None,
        chunk_threshold=DEFAULT_CHUNK_THRESHOLD,
        fold_projections=None,
    ):
        super().__init__()
        current()  # the switches read: a bad environment said where the layer is built
        check_positive('dim', dim)
        check_positive('num_heads', num_heads)
        if dim % num_heads:
            raise ValueError(f'num_heads must divide dim={dim}, got {num_heads}')
        check_positive('chunk_size', chunk_size, allow_none=True)
        check_positive('chunk_threshold', chunk_threshold)
        if not 0 <= attn_drop < 1:
            raise ValueError(f'attn_drop must be in [0, 1), got {attn_drop!r}')
        if fold_projections not in (None, True, False):
            raise ValueError(
                f'fold_projections must be None, True or False, got {fold_projections!r}'
            )
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.attn_drop = attn_drop
        self.chunk_size = chunk_size
        self.chunk_threshold = chunk_threshold
        self.fold_projections = fold_projections
        # gather: cores query the patches
        self.q_core = nn.Linear(dim, dim, bias=qkv_bias)
        self.k_patch = nn.Linear(dim, dim, bias=False)
        self.v_patch = nn.Linear(dim, dim, bias=qkv_bias)
        self.core_proj = nn.Linear(dim, dim)
        # broadcast: patches query the updated cores
        self.q_patch = nn.Linear(dim, dim, bias=qkv_bias)
        self.k_core = nn.Linear(dim, dim, bias=False)
        self.v_core = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self._plans = {}  # see _plan

    def extra_repr(self):
        return (
            f'dim={self.dim}, num_heads={self.num_heads}, chunk_size={self.chunk_size}, '
            f'chunk_threshold={self.chunk_threshold}'
        )

    def _chunk_len(self, n):
        if self.chunk_size is not None:
            return min(self.chunk_size, n)
        return n if n <= self.chunk_threshold else min(DEFAULT_CHUNK_SIZE, self.chunk_threshold)

    def _fold(self, num_cores):
        if self.fold_projections is not None:
            return self.fold_projections
        return self.num_heads * num_cores < self.dim + num_cores

    def _drop(self, p):
        return F.dropout(p, self.attn_drop) if self.training and self.attn_drop > 0 else p

    def split_heads(self, t):
        """(B, L, C) -> (B, heads, L, head_dim), a view: the layout of the heads that
        every product of this layer (and a probe of its weights) uses."""
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _run(self, fn, *args):
        """fn(*args) on one chunk; checkpointed under autograd, so that the chunk's
        scores are recomputed in backward instead of stored."""
        if torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args
        ):
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _patch_kv(self, xc, fold):
        """Keys and values of the patches xc (B, n, C) for the gather."""
        if fold:  # the raw patches serve every head: (B, n, C)
            return xc, xc
        # this chunk's projections only: (B, heads, n, head_dim)
        return self.split_heads(self.k_patch(xc)), self.split_heads(self.v_patch(xc))

    def _gather_step(self, q, xc, fold, track_mass, m, den, acc, mass):
        """One chunk of the online softmax of ``q`` over the patches ``xc``.

        q: (B, heads*C', C) folded or (B, heads, C', head_dim); xc (B, n, C). State
        (None before the first chunk): running max m, denominator den, weighted sum acc
        and, for the folded value bias under attention dropout, the running sum of the
        dropped weights (mass).
        """
        k, v = self._patch_kv(xc, fold)
        s = wide(q @ k.transpose(-1, -2))  # (..., rows, n) scaled scores, >= float32
        v = v.to(s.dtype)  # a no-op unless bf16 (autocast casts it back for the GEMM)
        m_new = s.detach().amax(-1, keepdim=True)  # (..., rows, 1)
        if m is not None:
            m_new = torch.maximum(m, m_new)
        e = torch.exp(s - m_new)  # (..., rows, n)
        de = self._drop(e)
        # den, acc (..., rows, dv), mass
        new = [e.sum(-1, keepdim=True), de @ v, de.sum(-1, keepdim=True) if track_mass else None]
        if m is not None:  # rescale the old state to the new max and add
            corr = torch.exp(m - m_new)
            new = [None if t is None else old * corr + t for old, t in zip((den, acc, mass), new)]
        return (m_new, *new)

    def _gather_queries(self, cores, fold):
        """The gather's scaled queries: (B, h, C', dh), or folded (B, h*C', C)."""
        b, nc, c = cores.shape
        h, dh = self.num_heads, self.head_dim
        q = self.split_heads(self.q_core(cores)) * self.scale  # (B, h, C', dh)
        if fold:  # (q W_k,h) . x : (B, h, C', dh) @ (h, dh, C) -> (B, h*C', C)
            q = (q @ self.k_patch.weight.view(h, dh, c)).view(b, h * nc, c)
        return q

    def _gather(self, cores, x, chunk, fold):
        """g = MHA(c W_qc, x W_kp, x W_vp), heads concatenated: (B, C', C)."""
        b, nc, c = cores.shape
        h, dh = self.num_heads, self.head_dim
        q = self._gather_queries(cores, fold)
        track = fold and self.training and self.attn_drop > 0
        if chunk >= x.shape[1] and not track:  # all patches at once (fused)
            k, v = self._patch_kv(x, fold)
            q, k, v = (q, k, v) if not fold else (q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1))
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.attn_drop if self.training else 0.0, scale=1.0
            )  # (B, h, C', dh) or (B, 1, h*C', C)
            out, mass = out.squeeze(1) if fold else out, None
        else:  # stream over chunks of patches with an online softmax
            state = (None,) * 4  # m, den, acc, mass
            for xc in x.split(chunk, dim=1):
                state = self._run(self._gather_step, q, xc, fold, track, *state)
            _, den, acc, mass = state
            out = acc / den  # sum_n p_n v_n: (B, h, C', dh) or (B, h*C', C)
        if fold:  # W_vp,h (sum_n p_n x_n) + b_h sum_n p_n: (B, h, C', dh)
            out = out.view(b, h, nc, c) @ self.v_patch.weight.view(h, dh, c).transpose(-1, -2)
            if self.v_patch.bias is not None:
                bias = self.v_patch.bias.view(h, 1, dh)
                out = out + (bias if mass is None else bias * (mass / den).view(b, h, nc, 1))
        return out.transpose(1, 2).reshape(b, nc, c)  # (B, C', C)

    def _broadcast_folded(self, xc, k_t, beta, v_t, bias):
        """proj(MHA) of chunk xc (B, n, C) against folded cores: (B, n, C)."""
        b, n, _ = xc.shape
        captured = graph_capture()  # those graphs keep the GEMMs
        if self.num_heads == 1 and not (torch.is_grad_enabled() or captured):
            # softmax(x k_t^T + beta) v_t as one fused SDPA, beta its additive mask
            k_t, v_t, beta = pad_keys(k_t, v_t, beta)
            y = F.scaled_dot_product_attention(
                xc.unsqueeze(1),  # (B, 1, n, C): queries
                k_t.unsqueeze(1).to(xc.dtype),  # (B, 1, C', C): keys
                v_t.unsqueeze(1).to(xc.dtype),  # (B, 1, C', C): values
                attn_mask=beta.unsqueeze(1).to(xc.dtype),  # (B, 1, 1, C')
                dropout_p=self.attn_drop if self.training else 0.0,
                scale=1.0,
            ).squeeze(1)  # (B, n, C)
            return y if bias is None else y + bias
        if captured:
            s = torch.baddbmm(beta, xc, k_t.transpose(1, 2))  # (B, n, h*C')
        else:  # the same product, its key gradient a faster GEMM
            s = Scores.apply(beta, xc, k_t)  # (B, n, h*C')
        p = core_softmax(s.view(b, n, self.num_heads, -1))  # (B, n, h, C'), >= float32
        p = self._drop(p).reshape(b, n, -1).to(s.dtype)  # (B, n, h*C')
        y = p @ v_t  # (B, n, C): the sum over heads is part of the product
        return y if bias is None else y + bias

    def _broadcast_plain(self, xc, k, v):
        """proj(MHA(x W_qp, k, v)) of chunk xc (B, n, C): (B, n, C)."""
        b, n, c = xc.shape
        q = self.split_heads(self.q_patch(xc))  # (B, h, n, dh)
        o = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.0
        )
        return self.proj(o.transpose(1, 2).reshape(b, n, c))

    def _broadcast(self, x, cores, chunk, fold):
        """y = proj(MHA(x W_qp, c' W_kc, c' W_vc)): (B, N, C)."""
        b, nc, c = cores.shape
        h, dh = self.num_heads, self.head_dim
        k = self.split_heads(self.k_core(cores))  # (B, h, C', dh)
        v = self.split_heads(self.v_core(cores))  # (B, h, C', dh)
        if fold:
            wq = self.q_patch.weight.view(h, dh, c)
            k_t = (k @ wq).view(b, h * nc, c) * self.scale  # W_qp,h^T k_h
            beta = (
                (k @ self.q_patch.bias.view(h, dh, 1)).view(b, 1, h * nc) * self.scale
                if self.q_patch.bias is not None
                else k.new_zeros(b, 1, h * nc)
            )  # b_qp,h . k_h
            wo = self.proj.weight.view(c, h, dh).permute(1, 2, 0)  # (h, dh, C)
            v_t = (v @ wo).reshape(b, h * nc, c)  # v_h W_o,h^T
            bias = self.proj.bias
            if bias is not None and not (self.training and self.attn_drop):
                # each head's weights sum to 1: b_o = sum_h P_h (b_o / h)
                v_t, bias = v_t + bias / h, None
            fn, args = self._broadcast_folded, (k_t, beta, v_t, bias)
        else:
            fn, args = self._broadcast_plain, (k, v)
        if chunk >= x.shape[1]:
            return fn(x, *args)
        y = x.new_empty(x.shape[:2] + (c,))
        start = 0
        for xc in x.split(chunk, dim=1):
            y[:, start : start + xc.shape[1]] = self._run(fn, xc, *args)
            start += xc.shape[1]
        return y

    def _new_plan(self, x, cores):
        """The input checks and :class:`CorePlan` of x (B, N, C) and cores (B, C', C)."""
        for name, t, axes in (('x', x, '(B, N, C)'), ('cores', cores, "(B, C', C)")):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                raise ValueError(
                    f'{name} must be a 3-D tensor {axes}, got {getattr(t, "shape", type(t))}'
                )
        if x.shape[-1] != self.dim or cores.shape[-1] != self.dim:
            raise ValueError(
                f'x and cores must have dim={self.dim} channels, '
                f'got {x.shape[-1]} and {cores.shape[-1]}'
            )
        if cores.shape[0] != x.shape[0]:
            raise ValueError(
                f'cores batch {cores.shape[0]} must equal x batch {x.shape[0]} '
                '(select_cores expands a bank)'
            )
        if cores.shape[1] < 1 or x.shape[1] < 1:
            raise ValueError(
                f"x needs N >= 1 patches and cores C' >= 1, got N={x.shape[1]}, C'={cores.shape[1]}"
            )
        return CorePlan(self._chunk_len(x.shape[1]), self._fold(cores.shape[1]))

    def _plan(self, x, cores):
        """:meth:`_new_plan`, kept per input shapes and the settings ``chunk_size``,
        ``chunk_threshold``, ``fold_projections`` for eager calls
        (:func:`~mmcirc.ops.settings.cached_plan`); made anew in a captured graph (symbolic
        sizes)."""
        tensors = isinstance(x, torch.Tensor) and isinstance(cores, torch.Tensor)
        if not tensors or graph_capture():
            return self._new_plan(x, cores)
        key = (x.shape, cores.shape, self.chunk_size, self.chunk_threshold, self.fold_projections)
        return cached_plan(self._plans, key, lambda: self._new_plan(x, cores))

    def forward(self, x, cores):
        """x (B, N, C) patches, cores (B, C', C) active cores (C' >= 1) -> (y (B, N, C),
        new_cores (B, C', C))."""
        chunk, fold = self._plan(x, cores)
        low = autocast_dtype(x.device.type)
        if x.dtype == torch.float32 and low is not None:
            # one cast of the patches (B, N, C) for the gather's and the broadcast's
            # GEMMs, instead of one per product that reads them
            x = x.to(low)
        g = self._gather(cores, x, chunk, fold)  # (B, C', C)
        new_cores = cores + self.core_proj(g)  # (B, C', C)
        y = self._broadcast(x, new_cores, chunk, fold)  # (B, N, C)
        return self.proj_drop(y), new_cores
