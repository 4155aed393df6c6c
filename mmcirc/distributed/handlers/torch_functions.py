"""The handlers of :class:`~mmcirc.distributed.banded_map.BandedMap` for the torch functions
that need the neighbours' rows or a global view; each returns this rank's band of the
single-process result (or, for a pooled map, the small map whole on every rank).

* ``F.conv2d``: any kernel / stride / padding / dilation / groups, by a halo exchange
  of the input rows the output band reads (:func:`~mmcirc.distributed.layers.conv2d_rows`);
  a 1 x 1 stride-1 conv without row padding is local;
* ``F.pad``: zero rows above / below by the same exchange (the padded map's bands);
* ``F.interpolate``: nearest and bilinear, both ``align_corners``, by size or scale
  (:func:`~mmcirc.distributed.layers.interpolate`);
* ``F.adaptive_avg_pool2d`` (the pooled map, replicated), ``F.group_norm`` and
  ``F.batch_norm`` (eval: local; training: statistics over every band by
  ``all_reduce``, i.e. plain BatchNorm runs as SyncBN over the spatial group);
* the token reshapes: ``flatten`` / ``reshape`` / ``view`` / ``unflatten`` whenever the
  rows stay the outermost index of the axis that holds them ((B, C, H, W) <-> (B, C, N)
  <-> (B, N, C) <-> (B, H, W, C)), ``transpose`` / ``permute``, and slicing that keeps
  every row;
* ``torch.cat`` along any other axis (the levels of a neck / head at one size; a plain
  operand that spans every row, e.g. a pooled branch resized back, is cut to the band),
  ``chunk`` / ``split`` along any other axis;
* the replicated prefix of a token map (:mod:`~mmcirc.distributed.banded_map`).

Every handler is differentiable (local torch ops around the exchanges and sums of
:mod:`~mmcirc.distributed.comm`). Importing this module (:mod:`mmcirc.distributed`
does) registers them.
"""

import math

import torch
import torch.nn.functional as F

from ..banded_map import BandedMap, HANDLERS, refuse, register
from ..row_split import band_bounds
from ..comm import exchange_rows
from ..layers import (
    adaptive_avg_pool, batch_norm_rows, conv2d_rows, conv_out_size, group_norm_rows, interpolate,
)  # fmt: skip

__all__ = ['HANDLERS']


def _map(x, name: str) -> BandedMap:
    """x must be a banded (B, C, H, W) map whose rows are axis 2."""
    if not isinstance(x, BandedMap) or x.dim() != 4 or x.band_dim != 2 or x.unit != 1:
        raise refuse(name, 'takes a (B, C, H, W) map banded along H')
    return x


@register(F.conv2d)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    x = _map(input, 'F.conv2d')
    if isinstance(padding, str) or isinstance(weight, BandedMap):
        raise refuse('F.conv2d', f'takes int padding and a plain weight, got padding={padding!r}')
    k = weight.shape[-2]
    s, p, d = (v[0] if isinstance(v, (tuple, list)) else v for v in (stride, padding, dilation))
    if k == 1 and s == 1 and p == 0 and x.local.shape[-2]:  # rows map to rows
        return x.like(F.conv2d(x.local, weight, bias, stride, padding, dilation, groups))
    out = conv2d_rows(x.local, x.layout, weight, bias, stride, padding, dilation, groups,
                      group=x.group)  # fmt: skip
    return x.like(out, height=conv_out_size(x.height, k, s, p, d))  # (B, C', h'_r, W')


@register(F.pad)
def pad(input, pad, mode='constant', value=None):
    x = _map(input, 'F.pad')
    pad = [int(v) for v in pad]
    top, bottom = (pad[2], pad[3]) if len(pad) >= 4 else (0, 0)
    if len(pad) > 4 or min(pad) < 0 or ((top or bottom) and (mode != 'constant' or value)):
        raise refuse('F.pad', f"pads rows with zeros only (mode='constant'), got {pad} {mode!r}")
    y = F.pad(x.local, pad[:2], mode, value) if pad[:2] != [0, 0] else x.local  # columns
    if not (top or bottom):
        return x.like(y)
    height = x.height + top + bottom
    bounds = band_bounds(height, x.world_size)  # the padded map's bands
    wants = [(a - top, b - top) if b > a else (0, 0) for a, b in bounds]
    rows = exchange_rows(y, x.layout, wants, dim=2, group=x.group)  # (B, C, h'_r, W')
    return x.like(rows, height=height)


@register(F.interpolate)
def interpolate_(input, size=None, scale_factor=None, mode='nearest', align_corners=None,
                 recompute_scale_factor=None, antialias=False):  # fmt: skip
    x = _map(input, 'F.interpolate')
    if recompute_scale_factor or antialias:
        raise refuse('F.interpolate', 'takes recompute_scale_factor=None, antialias=False')
    if size is not None and not isinstance(size, (tuple, list, torch.Size)):
        size = (int(size), int(size))
    out = interpolate(x.local, size, scale_factor, mode, align_corners, group=x.group,
                      in_layout=x.layout)  # fmt: skip
    if size is not None:
        h = int(size[0])
    else:
        sf = scale_factor[0] if isinstance(scale_factor, (tuple, list)) else scale_factor
        h = int(math.floor(x.height * float(sf)))
    return x.like(out, height=h)  # (B, C, h'_r, W')


@register(F.adaptive_avg_pool2d)
def adaptive_avg_pool2d(input, output_size):
    x = _map(input, 'F.adaptive_avg_pool2d')
    osize = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * 2
    if osize[0] is None:
        raise refuse('F.adaptive_avg_pool2d', 'takes an int output height')
    return adaptive_avg_pool(x.local, output_size, x.layout, x.group)  # whole


@register(F.group_norm)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    x = _map(input, 'F.group_norm')
    return x.like(group_norm_rows(x.local, num_groups, weight, bias, eps, x.group))


@register(F.batch_norm)
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):  # fmt: skip
    """Eval: local. Training: the statistics over the batch and every band (SyncBN over
    the spatial group), the running statistics updated alike on every rank."""
    params = (running_mean, running_var, weight, bias)
    if not isinstance(input, BandedMap) or any(isinstance(t, BandedMap) for t in params):
        raise refuse('F.batch_norm', 'takes a row-banded input and plain statistics')
    x = input
    if x.dim() < 2 or x.band_dim == 1:
        raise refuse('F.batch_norm', 'over the banded axis has no handler')
    if not training:
        return x.like(F.batch_norm(x.local, *params, False, momentum, eps))
    if x.numel() // x.shape[1] < 2:
        raise refuse(
            'F.batch_norm',
            f'in training needs more than one value per channel, got {tuple(x.shape)}',
        )
    return x.like(batch_norm_rows(x.local, *params, momentum, eps, x.group))


# --------------------------------------------------------------------------- reshapes
def _new_band(x: BandedMap, new_shape, name: str):
    """(axis, unit) of the rows in the global ``new_shape``: the axis where the product
    of the leading sizes is that before the rows and whose size is H rows of ``unit``."""
    lead, prod = math.prod(x.shape[: x.band_dim]), 1
    for k, n in enumerate(new_shape):
        if prod == lead and n % x.height == 0 and n > 0:
            return k, n // x.height
        prod *= n
        if prod > lead:
            break
    raise refuse(name, f'of {tuple(x.shape)} to {tuple(new_shape)} splits the rows')


def _reshape_like(name, method):
    def handler(self, *args, **kwargs):
        new = method(torch.empty(self.shape, device='meta'), *args, **kwargs).shape
        k, unit = _new_band(self, new, name)
        a, b = self.row_range
        local = list(new)
        local[k] = (b - a) * unit
        out = self.local.reshape(local)  # (the band of the new shape)
        return BandedMap.from_local(out, self.height, k, unit, self.group)

    return handler


for _name in ('flatten', 'reshape', 'view', 'unflatten'):
    _h = _reshape_like(_name, getattr(torch.Tensor, _name))
    register(getattr(torch.Tensor, _name))(_h)
    if hasattr(torch, _name):
        register(getattr(torch, _name))(_h)


@register(torch.Tensor.view_as, torch.Tensor.reshape_as)
def reshape_as(self, other):
    return HANDLERS[torch.Tensor.reshape](self, other.shape)


@register(torch.Tensor.permute, torch.permute)
def permute(self, *dims):
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    order = [d % self.dim() for d in dims]
    k = order.index(self.band_dim)
    return BandedMap.from_local(self.local.permute(order), self.height, k, self.unit, self.group)


@register(torch.Tensor.transpose, torch.transpose)
def transpose(self, dim0, dim1):
    order = list(range(self.dim()))
    d0, d1 = dim0 % self.dim(), dim1 % self.dim()
    order[d0], order[d1] = order[d1], order[d0]
    return permute(self, order)


@register(torch.Tensor.__getitem__, prefix=True)
def getitem(self, index):
    idx = index if isinstance(index, tuple) else (index,)
    if any(not isinstance(i, slice) and i is not Ellipsis for i in idx):
        raise refuse('Tensor.__getitem__', 'of a row-banded map takes slices only')
    if Ellipsis in idx:
        e = idx.index(Ellipsis)
        idx = idx[:e] + (slice(None),) * (self.dim() - len(idx) + 1) + idx[e + 1 :]
    bd, k = self.band_dim, self.prefix
    rows = idx[bd] if len(idx) > bd else slice(None)
    if rows == slice(None):
        return self.like(self.local[idx])
    if k and rows in (slice(None, k), slice(0, k)):  # the prefix, the same on every rank
        return self.local[idx]
    if k and rows == slice(k, None):  # the map without its prefix
        return BandedMap.from_local(self.local[idx], self.height, bd, self.unit, self.group)
    raise refuse('Tensor.__getitem__', 'of a row-banded map keeps every row (or cuts the prefix)')


def _split_like(name, method):
    def handler(self, size, dim=0):
        if dim % self.dim() == self.band_dim:
            raise refuse(name, 'of a row-banded map splits along another axis than the rows')
        return tuple(self.like(t) for t in method(self.local, size, dim))

    return handler


for _name in ('chunk', 'split'):
    register(getattr(torch.Tensor, _name), getattr(torch, _name), prefix=True)(
        _split_like(f'Tensor.{_name}', getattr(torch.Tensor, _name))
    )


def _prefixed(tensors, dim: int) -> BandedMap:
    """``torch.cat([plain (B, k, C), tokens (B, N, C)], dim)`` along the tokens' rows:
    the map with a replicated prefix of k tokens (local (B, k + n_r, C))."""
    if len(tensors) != 2 or isinstance(tensors[0], BandedMap) or tensors[1].prefix:
        raise refuse('torch.cat', 'of row-banded maps joins along another axis than the rows '
                      '(or puts one plain prefix before a map without one)')  # fmt: skip
    head, x = tensors
    k = head.shape[dim]
    out = torch.cat([head, x.local], dim)  # (B, k + n_r, C)
    return BandedMap.from_local(out, x.height, dim, x.unit, x.group, prefix=k)


@register(torch.cat, torch.concat, torch.concatenate, prefix=True)
def cat(tensors, dim=0, *, out=None):
    bands = [t for t in tensors if isinstance(t, BandedMap)]
    ref = bands[0]
    dim = dim % ref.dim()
    if out is None and dim == ref.band_dim:
        return _prefixed(list(tensors), dim)
    if out is not None:
        raise refuse('torch.cat', 'takes no out= on row-banded maps')
    parts = []
    for t in tensors:
        if isinstance(t, BandedMap):
            if not t.same_layout(ref):
                raise refuse('torch.cat', 'got row-banded maps of different layouts')
            parts.append(t.local)
        elif t.shape[ref.band_dim] == ref.shape[ref.band_dim]:
            parts.append(ref.cut(t, ref.band_dim))  # a plain map of every row
        else:
            raise refuse('torch.cat', f'got a plain operand of shape {tuple(t.shape)}')
    return ref.like(torch.cat(parts, dim))


@register(F.multi_head_attention_forward)
def multi_head_attention_forward(query, key, value, *args, **kwargs):
    """Queries: this rank's band (L_r, B, E); keys and values whole: a banded key / value
    is gathered once (the reduced map of SRA is small). Output (and weights, averaged
    (B, L_r, S) or per head (B, heads, L_r, S)) banded."""
    if not isinstance(query, BandedMap) or query.band_dim != 0:
        raise refuse('F.multi_head_attention_forward', 'takes banded queries (L, B, E)')
    if kwargs.get('key_padding_mask') is not None or kwargs.get('attn_mask') is not None:
        raise refuse('F.multi_head_attention_forward', 'takes no masks')
    whole = {}

    def full(t):
        if not isinstance(t, BandedMap):
            return t
        if id(t) not in whole:
            whole[id(t)] = t.full_tensor()  # (S, B, E) on every rank
        return whole[id(t)]

    out, weights = F.multi_head_attention_forward(
        query.local, full(key), full(value), *args, **kwargs
    )  # (L_r, B, E), (B, [heads,] L_r, S) | None
    if weights is not None:
        weights = BandedMap.from_local(weights, query.height, -2, query.unit, query.group)
    return query.like(out), weights
