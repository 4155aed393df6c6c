"""The sharded row-local ops (mmcirc.distributed.comm / layers) on 2 and 3 gloo ranks
against the single-process torch ops (float64).

One run_parallel call per world size computes every case on the bands of
``band_bounds``; the tests assemble the bands here and compare them with the
single-process layer run in this process. Heights (7, 10, 11, 13) do not divide by 2 or 3.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmcirc.distributed import band_bounds, run_parallel
from mmcirc.distributed.comm import Layout, exchange_rows, gather_rows
from mmcirc.distributed.layers import adaptive_avg_pool, conv2d_rows, group_norm_rows, interpolate

TOL = dict(rtol=1e-12, atol=1e-12)
# name: (Conv2d kwargs, input (B, C, H, W), extra zero rows (top, bottom))
CONVS = {
    'cpe_3x3_depthwise': (dict(kernel_size=3, padding=1, groups=4), (2, 4, 11, 6), (0, 0)),
    'patch_embed_4x4_s4': (dict(kernel_size=4, stride=4), (1, 4, 13, 8), (0, 3)),
    'overlap_7x7_s4_p3': (dict(kernel_size=7, stride=4, padding=3), (1, 4, 13, 9), (0, 0)),
    'strided_3x3_s2_p1': (dict(kernel_size=3, stride=2, padding=1), (1, 4, 11, 7), (0, 0)),
    'dilated_3x3_d2_p2': (dict(kernel_size=3, padding=2, dilation=2), (1, 4, 10, 7), (0, 0)),
    'sra_2x2_s2': (dict(kernel_size=2, stride=2), (1, 4, 11, 6), (0, 0)),
    'asym_5x3_p21': (dict(kernel_size=(5, 3), padding=(2, 1)), (1, 4, 10, 5), (0, 0)),
    'same_pad_rows_1_2': (dict(kernel_size=4, stride=2), (1, 4, 11, 6), (1, 2)),
    'pointwise_1x1': (dict(kernel_size=1), (1, 4, 7, 5), (0, 0)),
}
# name: (input (B, C, H, W), F.interpolate kwargs)
INTERPS = {
    'nearest_size': ((1, 3, 7, 5), dict(size=(13, 9), mode='nearest')),
    'nearest_x2': ((1, 3, 7, 5), dict(size=(14, 10), mode='nearest')),
    'nearest_down': ((1, 3, 13, 9), dict(size=(7, 5), mode='nearest')),
    'bilinear_size': ((1, 3, 7, 5), dict(size=(29, 11), mode='bilinear', align_corners=False)),
    'bilinear_size_ac': ((1, 3, 7, 5), dict(size=(29, 11), mode='bilinear', align_corners=True)),
    'bilinear_scale4': ((1, 3, 7, 5), dict(scale_factor=4, mode='bilinear', align_corners=False)),
    'bilinear_scale_half': ((1, 3, 13, 9), dict(scale_factor=0.5, mode='bilinear')),
    'bilinear_down_ac': ((1, 3, 13, 9), dict(size=(5, 4), mode='bilinear', align_corners=True)),
}
POOLS = {'pool_1': 1, 'pool_2': 2, 'pool_3': 3, 'pool_6': 6, 'pool_2x5': (2, 5)}
NORMS = {'groupnorm_2': (2, (2, 4, 11, 5)), 'groupnorm_4_affine': (4, (1, 8, 10, 3))}


def _seeded(name, shape):
    torch.manual_seed(sum(map(ord, name)))
    return torch.randn(shape, dtype=torch.float64)


def _conv(name):
    kwargs, shape, pad = CONVS[name]
    x = _seeded(name, shape)
    conv = nn.Conv2d(shape[1], 5 if kwargs.get('groups', 1) == 1 else shape[1], **kwargs)
    return conv.double(), x, pad


def _band(x, rank, size, dim=-2):
    a, b = band_bounds(x.shape[dim], size)[rank]
    return x.narrow(dim % x.dim(), a, b - a).contiguous()


def _layout(height, rank, size):
    return Layout([a for a, _ in band_bounds(height, size)] + [height], rank)


def _worker():
    rank, size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    out = {}
    with torch.no_grad():
        for name in CONVS:
            c, x, pad = _conv(name)
            lay = _layout(x.shape[-2], rank, size)
            out[name] = conv2d_rows(
                _band(x, rank, size), lay, c.weight, c.bias, c.stride, c.padding, c.dilation,
                c.groups, pad,
            )  # fmt: skip
        for name, (shape, kw) in INTERPS.items():
            x = _seeded(name, shape)
            lay = _layout(shape[-2], rank, size)
            out[name] = interpolate(_band(x, rank, size), **kw, in_layout=lay)
        for name, osize in POOLS.items():
            x = _seeded(name, (2, 3, 13, 11))
            out[name] = adaptive_avg_pool(_band(x, rank, size), osize, _layout(13, rank, size))
        for name, (groups, shape) in NORMS.items():
            gn = _norm(name, groups, shape[1])
            x = _band(_seeded(name, shape), rank, size)
            out[name] = group_norm_rows(x, groups, gn.weight, gn.bias, gn.eps)
        # any ranges, past both ends of the map: zeros there
        x = _seeded('exchange', (2, 10, 3))
        wants = [(-3, 4), (2, 13), (9, 10), (0, 0)][:size]
        lay = _layout(10, rank, size)
        out['exchange_rows'] = exchange_rows(_band(x, rank, size, dim=1), lay, wants, dim=1)
        out['gather_rows_all'] = gather_rows(_band(x, rank, size, dim=1), lay, dim=1)
        out['gather_rows_dst0'] = gather_rows(_band(x, rank, size, dim=1), lay, dim=1, dst=0)
    return out


def _norm(name, groups, channels):
    gn = nn.GroupNorm(groups, channels).double()
    torch.manual_seed(len(name))
    nn.init.normal_(gn.weight)
    nn.init.normal_(gn.bias)
    return gn


@pytest.fixture(scope='module', params=[2, 3])
def results(request):
    size = request.param
    return size, run_parallel(_worker, size)


def _assembled(results, name):
    size, outs = results
    return torch.cat([outs[r][name] for r in range(size)], dim=-2)


@pytest.mark.parametrize('name', list(CONVS))
def test_conv_bands_equal_single_process(results, name):
    conv, x, (top, bottom) = _conv(name)
    ref = conv(F.pad(x, (0, 0, top, bottom)))
    torch.testing.assert_close(_assembled(results, name), ref, **TOL)


@pytest.mark.parametrize('name', list(INTERPS))
def test_interpolate_bands_equal_f_interpolate(results, name):
    shape, kw = INTERPS[name]
    ref = F.interpolate(_seeded(name, shape), **kw)
    torch.testing.assert_close(_assembled(results, name), ref, **TOL)


@pytest.mark.parametrize('name', list(POOLS))
def test_adaptive_pool_replicated_on_every_rank(results, name):
    size, outs = results
    ref = F.adaptive_avg_pool2d(_seeded(name, (2, 3, 13, 11)), POOLS[name])
    for r in range(size):
        torch.testing.assert_close(outs[r][name], ref, **TOL)


@pytest.mark.parametrize('name', list(NORMS))
def test_groupnorm_bands_equal_single_process(results, name):
    groups, shape = NORMS[name]
    ref = _norm(name, groups, shape[1])(_seeded(name, shape))
    torch.testing.assert_close(_assembled(results, name), ref, **TOL)


def test_exchange_rows_zero_outside_the_map(results):
    size, outs = results
    x = _seeded('exchange', (2, 10, 3))
    padded = F.pad(x, (0, 0, 3, 3))  # rows -3 .. 12
    for r, (lo, hi) in enumerate([(-3, 4), (2, 13), (9, 10), (0, 0)][:size]):
        torch.testing.assert_close(outs[r]['exchange_rows'], padded[:, lo + 3 : hi + 3], **TOL)


def test_gather_rows_whole_map(results):
    size, outs = results
    x = _seeded('exchange', (2, 10, 3))
    for r in range(size):
        torch.testing.assert_close(outs[r]['gather_rows_all'], x, **TOL)
    torch.testing.assert_close(outs[0]['gather_rows_dst0'], x, **TOL)
    assert all(outs[r]['gather_rows_dst0'] is None for r in range(1, size))
