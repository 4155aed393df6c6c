"""Core attention of row-band-sharded patches (METHOD.md section 4, 'Core gather').

:class:`ShardedCoreAttention` is :class:`~mmcirc.ops.core.CoreAttention` (same state
dict) on this rank's band of patches; the cores are the same on every rank.

* Gather: the streaming (online-softmax) gather of the single-process layer runs over
  the local patches (in chunks as there: ``chunk_size`` / ``chunk_threshold`` apply to
  the local n_r), giving per head and core the local max m_r, denominator l_r and
  weighted sum o_r. With m = max_r m_r (``all_reduce(MAX)``),
  l = sum_r e^(m_r - m) l_r and o = sum_r e^(m_r - m) o_r (one ``all_reduce(SUM)``),
  gathered = o / l. Folded order: the value projection W_vp (linear) is applied to
  e^(m_r - m) o_r before the sum, so the sum always carries heads x (1 + head_dim)
  values per core.
* Broadcast: local (patches attend to the C' updated cores), chunked as there.
* Backward: autograd through the same steps (the local chunks checkpointed as there),
  the sum by a differentiable ``all_reduce`` (the max only shifts: no gradient), which
  adds the ranks' parts of the gradient of the replicated new cores.

Communication per forward (s bytes per element of the compute dtype), payload of each
rank in the two ``all_reduce`` calls::

    s * B * C' * (heads + (heads + C))    (MAX: B heads C', SUM: B C' (heads + C))

(+ s B heads C' for the folded order with attention dropout in training), independent
of the image size: elastic C' scales it linearly. A ring all-reduce moves about
2 (P - 1) / P times the payload per rank. :func:`core_comm_bytes` gives the figure.

Importing this module registers the handler of CoreAttention.
"""

import torch
import torch.distributed as dist

from mmcirc.ops.core import CoreAttention

from ..banded_map import BandedMap, ShardedOperator, operator_twin, refuse, register_operator
from ..comm import all_reduce_sum, group_rank_size

__all__ = ['ShardedCoreAttention', 'core_banded', 'core_comm_bytes']


def core_comm_bytes(batch, channels, num_heads, num_cores, real_bytes=4):
    """Payload bytes of one rank's ``all_reduce`` calls in one
    :class:`ShardedCoreAttention` forward (eval)."""
    return real_bytes * batch * num_cores * (2 * num_heads + channels)


class ShardedCoreAttention(ShardedOperator, CoreAttention):
    """:class:`~mmcirc.ops.core.CoreAttention` on the local band of patches (the
    arguments of :class:`~mmcirc.distributed.banded_map.ShardedOperator`)."""

    ARGS = ('dim', 'num_heads', 'attn_drop', 'chunk_size', 'chunk_threshold', 'fold_projections')

    def _gather(self, cores, x, chunk, fold):
        """g = MHA(c W_qc, x W_kp, x W_vp) over the patches of all ranks: (B, C', C)."""
        b, nc, c = cores.shape
        h, dh = self.num_heads, self.head_dim
        q = self._gather_queries(cores, fold)  # (B, h, C', dh) | (B, h*C', C)
        track = fold and self.training and self.attn_drop > 0
        if x.shape[1] == 0:  # no local patches: the neutral state
            m = q.new_full((*q.shape[:-1], 1), float('-inf'))  # (B, h, C', 1) | (B, h*C', 1)
            den, acc = torch.zeros_like(m), torch.zeros_like(q)  # acc: the shape of q
            mass = torch.zeros_like(m) if track else None
        else:  # local streaming softmax, the single-process step
            state = (None,) * 4  # m, den, acc, mass
            for xc in x.split(chunk, dim=1):
                state = self._run(self._gather_step, q, xc, fold, track, *state)
            m, den, acc, mass = state  # (B, h, C', 1|dh) or (B, h*C', 1|C)
        if fold:  # W_vp,h applied before the sum (linear): (B, h, C', dh)
            acc = acc.view(b, h, nc, c) @ self.v_patch.weight.view(h, dh, c).transpose(-1, -2)
            m, den = m.view(b, h, nc, 1), den.view(b, h, nc, 1)
            mass = None if mass is None else mass.view(b, h, nc, 1)
        # combine the ranks: rescale to the global max, one sum of (den, acc[, mass])
        m_all = m.detach().clone()  # a shift the result does not see: no gradient
        if group_rank_size(self.group)[1] > 1:
            dist.all_reduce(m_all, op=dist.ReduceOp.MAX, group=self.group)
        corr = torch.exp(m - m_all)  # (B, h, C', 1), 0 for a rank without patches
        parts = [den * corr, acc * corr] + ([mass * corr] if mass is not None else [])
        red = torch.cat(parts, dim=-1)  # (B, h, C', 1 + dh [+ 1])
        red = all_reduce_sum(red, self.group)  # differentiable
        den, out = red[..., :1], red[..., 1 : 1 + dh]  # (B, h, C', 1), (B, h, C', dh)
        out = out / den  # sum_n p_n (W_vp x_n) or sum_n p_n v_n
        if fold and self.v_patch.bias is not None:  # + b_h sum_n p_n
            bias = self.v_patch.bias.view(h, 1, dh)
            out = out + (bias if mass is None else bias * (red[..., -1:] / den))
        return out.transpose(1, 2).reshape(b, nc, c)  # (B, C', C)

    def forward(self, x, cores):
        """x (B, n_r, C): this rank's patches (any split of the N patches over the ranks,
        n_r >= 0), cores (B, C', C) identical on every rank. Returns (y (B, n_r, C),
        new_cores (B, C', C)), new_cores bitwise the same on every rank."""
        if isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[1] == 0:
            g = self._gather(cores, x, 1, self._fold(cores.shape[1]))
            new_cores = cores + self.core_proj(g)
            return x.clone(), new_cores  # no patches (kept in the autograd graph)
        return super().forward(x, cores)


@register_operator(CoreAttention)
def core_banded(module: CoreAttention, x, cores):
    """The :class:`~mmcirc.distributed.banded_map.BandedMap` handler of a CoreAttention: the
    band of patches x (B, N, C) and the cores (B, C', C), the same on every rank ->
    (the band of y, new cores on every rank), by a :class:`ShardedCoreAttention`
    sharing the module's weights."""
    if not isinstance(x, BandedMap) or x.band_dim != 1 or isinstance(cores, BandedMap):
        raise refuse('CoreAttention', 'takes patches (B, N, C) banded along N and plain cores')
    twin = operator_twin(module, ShardedCoreAttention, x.group)
    y, new_cores = twin(x.local, cores)  # (B, n_r, C), (B, C', C)
    return x.like(y), new_cores
