"""mmcirc.distributed.banded_map (the row-banded map) with the handlers of
mmcirc.distributed.handlers.torch_functions on 2 and 3 gloo ranks, against the
single-process torch ops and mmseg's own heads and necks run unchanged (float64).

One run_parallel call per world size computes every case on BandedMap.scatter bands;
each rank returns its ``full_tensor()`` (the whole map, all-gathered) and the tests
compare every rank's with the single-process result computed in this process. Heights
(11, 90 -> 23, 12, 6, 3) do not divide by 2 or 3.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmcirc.distributed import run_parallel
from mmcirc.distributed import BandedMap

TOL = dict(rtol=1e-12, atol=1e-12)
BN = dict(type='BN', requires_grad=True)
WIDTHS = (4, 6, 8, 10)
# name: mmseg decode head config (4 pyramid levels of WIDTHS channels)
HEADS = {
    'FCNHead': dict(in_channels=8, in_index=2, num_convs=2, concat_input=True, dilation=2),
    'PSPHead': dict(in_channels=10, in_index=3, pool_scales=(1, 2, 3, 6)),
    'ASPPHead': dict(in_channels=10, in_index=3, dilations=(1, 2, 3)),
    'SegformerHead': dict(in_channels=list(WIDTHS), in_index=[0, 1, 2, 3]),
    'UPerHead': dict(in_channels=list(WIDTHS), in_index=[0, 1, 2, 3], pool_scales=(1, 2, 3, 6)),
    'FPNHead': dict(in_channels=list(WIDTHS), in_index=[0, 1, 2, 3],
                    feature_strides=[4, 8, 16, 32]),
}  # fmt: skip
NECKS = {
    'FPN': dict(in_channels=list(WIDTHS), out_channels=6, num_outs=4),
    'MultiLevelNeck': dict(in_channels=[6] * 4, out_channels=6, scales=[4, 2, 1, 0.5]),
}


def _x(name, shape):
    torch.manual_seed(sum(map(ord, name)))
    return torch.randn(shape, dtype=torch.float64)


def _levels(hw=(90, 37)):
    """Four maps at strides 4, 8, 16, 32 of an hw image (ceil), WIDTHS channels."""
    out, (h, w) = [], hw
    for i, c in enumerate(WIDTHS):
        h, w = -(-h // (4 if i == 0 else 2)), -(-w // (4 if i == 0 else 2))
        out.append(_x(f'level{i}', (1, c, h, w)))
    return out


def _randomise_bn(m):
    torch.manual_seed(3)
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m.double().eval()


def _head(name):
    from mmseg.registry import MODELS

    torch.manual_seed(0)
    cfg = dict(HEADS[name], type=name, channels=6, num_classes=5, norm_cfg=BN, dropout_ratio=0.1)
    return _randomise_bn(MODELS.build(cfg))


def _neck(name):
    from mmseg.registry import MODELS

    torch.manual_seed(0)
    return _randomise_bn(MODELS.build(dict(NECKS[name], type=name)))


def _neck_inputs(name):
    levels = _levels()
    return levels if name == 'FPN' else [_x(f'vit{i}', (1, 6, 13, 9)) for i in range(4)]


def _ops(x):
    """name -> f(x) for a (1, 4, 11, 6) map x: every handler and the local rule."""
    conv_s2 = _seeded_module(nn.Conv2d(4, 5, 3, stride=2, padding=1))
    conv_dw = _seeded_module(nn.Conv2d(4, 4, (5, 3), padding=(2, 1), dilation=(2, 1), groups=4))
    ln = _seeded_module(nn.LayerNorm(4))
    lin = _seeded_module(nn.Linear(4, 3))

    def tokens(m):  # (B, C, H, W) -> tokens -> LayerNorm, Linear -> (B, C', H, W)
        t = lin(ln(m.flatten(2).transpose(1, 2)))  # (B, HW, 3)
        return t.transpose(1, 2).reshape(1, 3, 11, 6)

    return {
        'conv_s2_relu': lambda m: F.relu(conv_s2(m)) + 1.0,
        'conv_dw_dilated': conv_dw,
        'pad_rows_cols': lambda m: F.pad(m, (1, 2, 3, 1)),
        'interp_bilinear': lambda m: F.interpolate(m, (23, 9), mode='bilinear'),
        'interp_nearest_scale': lambda m: F.interpolate(m, scale_factor=2.5, mode='nearest'),
        'group_norm': lambda m: F.group_norm(m, 2),
        'tokens_roundtrip': tokens,
        'nhwc_permute': lambda m: ln(m.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
        'cat_pooled_branch': lambda m: torch.cat(
            [m, F.interpolate(F.adaptive_avg_pool2d(m, 1), m.shape[2:], mode='bilinear')], 1
        ),
        'slice_channels': lambda m: m[:, 1:3] * m[..., :, :].sigmoid()[:, :2],
        'normalize_channels': lambda m: (
            F.normalize(m, dim=1) + F.normalize(m.transpose(1, 3), dim=-1).transpose(1, 3)
        ),
    }


def _seeded_module(m):
    torch.manual_seed(7)
    for p in m.parameters():
        nn.init.normal_(p)
    return m.double()


def _worker():
    out = {}
    with torch.no_grad():
        x = _x('map', (1, 4, 11, 6))
        for name, f in _ops(x).items():
            out[name] = f(BandedMap.scatter(x)).full_tensor()
        out['adaptive_pool_3'] = F.adaptive_avg_pool2d(BandedMap.scatter(x), 3)
        for name in HEADS:
            out[name] = _head(name)([BandedMap.scatter(t) for t in _levels()]).full_tensor()
        for name in NECKS:
            outs = _neck(name)([BandedMap.scatter(t) for t in _neck_inputs(name)])
            out[name] = [o.full_tensor() for o in outs]
        for name, f in _refused().items():
            try:
                f(BandedMap.scatter(x))
                out[name] = 'not refused'
            except ValueError as err:
                out[name] = str(err)
        y = _prefixed(BandedMap.scatter(x))
        out['prefixed'] = [y[0].full_tensor(), y[1], y[2].full_tensor()]
        for name, f in _refused_prefixed().items():
            try:
                f(_prefixed(BandedMap.scatter(x))[0])
                out[name] = 'not refused'
            except ValueError as err:
                out[name] = str(err)
    return out


def _prefixed(m):
    """A (1, 4, 11, 6) map's tokens behind a replicated prefix of 3 tokens (VECA's
    layout): channel-wise ops, a plain operand over all 3 + 66 tokens, chunk, then the
    prefix and the map without it -> (prefixed map, prefix, map (1, 4, 11, 6))."""
    ln = _seeded_module(nn.LayerNorm(4))
    t = m.flatten(2).transpose(1, 2)  # (1, 66, 4)
    x = torch.cat([_x('prefix', (1, 3, 4)), t], dim=1)  # (1, 3 + 66, 4)
    u, v = ln(x * _x('over_all', (1, 69, 1))).chunk(2, dim=-1)  # (1, 69, 2) each
    x = torch.cat([u.sigmoid() * v, u], dim=-1) + x  # (1, 69, 4)
    return x, x[:, :3] * 2, x[:, 3:].transpose(1, 2).reshape(1, 4, 11, 6)


def _refused_prefixed():
    return {
        'refuse_prefixed_transpose': lambda x: x.transpose(1, 2),
        'refuse_prefixed_slice_in_band': lambda x: x[:, 5:],
        'refuse_prefixed_cat_tokens': lambda x: torch.cat([x[:, :3], x], 1),
        'refuse_prefixed_sum_over_tokens': lambda x: x.sum(1),
    }


def _refused():
    return {
        'refuse_sum_over_rows': lambda m: m.sum(2),
        'refuse_reflect_pad_rows': lambda m: F.pad(m, (0, 0, 1, 1), mode='reflect'),
        'refuse_flatten_across_rows': lambda m: m.flatten(1),
        'refuse_cat_rows': lambda m: torch.cat([m, m], 2),
        'refuse_rfft2': lambda m: torch.fft.rfft2(m),
        # F.normalize's default dim=1 is the token axis of (B, N, C): a global norm
        'refuse_normalize_over_tokens': lambda m: F.normalize(m.flatten(2).transpose(1, 2)),
        'refuse_normalize_over_rows': lambda m: F.normalize(m, dim=-2),
    }


@pytest.fixture(scope='module', params=[2, 3])
def results(request):
    return run_parallel(_worker, request.param)


def _every_rank(results, name, ref):
    for out in results:
        torch.testing.assert_close(out[name], ref, **TOL)


@pytest.mark.parametrize('name', list(_ops(None)))
def test_handled_and_local_ops_equal_single_process(results, name):
    x = _x('map', (1, 4, 11, 6))
    with torch.no_grad():
        _every_rank(results, name, _ops(x)[name](x))


def test_adaptive_pool_is_the_whole_pooled_map(results):
    _every_rank(results, 'adaptive_pool_3', F.adaptive_avg_pool2d(_x('map', (1, 4, 11, 6)), 3))


@pytest.mark.parametrize('name', list(HEADS))
def test_mmseg_head_forward_unchanged_on_banded_maps(results, name):
    with torch.no_grad():
        _every_rank(results, name, _head(name)(_levels()))


@pytest.mark.parametrize('name', list(NECKS))
def test_mmseg_neck_forward_unchanged_on_banded_maps(results, name):
    with torch.no_grad():
        refs = _neck(name)(_neck_inputs(name))
    for out in results:
        assert len(out[name]) == len(refs)
        for got, ref in zip(out[name], refs):
            torch.testing.assert_close(got, ref, **TOL)


@pytest.mark.parametrize(
    'name, op',
    [
        ('refuse_sum_over_rows', 'Tensor.sum'),
        ('refuse_reflect_pad_rows', 'F.pad'),
        ('refuse_flatten_across_rows', 'flatten'),
        ('refuse_cat_rows', 'torch.cat'),
        ('refuse_rfft2', 'rfft2'),
        ('refuse_normalize_over_tokens', 'F.normalize'),
        ('refuse_normalize_over_rows', 'F.normalize'),
    ],
)
def test_an_op_without_handler_is_refused_by_name(results, name, op):
    for out in results:
        assert out[name].startswith('sharded inference: ') and op in out[name], out[name]


def test_replicated_prefix_equals_single_process(results):
    x = _x('map', (1, 4, 11, 6))
    with torch.no_grad():
        refs = _prefixed(x)
    for out in results:
        for got, ref in zip(out['prefixed'], refs):
            assert not isinstance(got, BandedMap)
            torch.testing.assert_close(got, ref, **TOL)


@pytest.mark.parametrize(
    'name, op',
    [
        ('refuse_prefixed_transpose', 'Tensor.transpose has no handler for a map with a replicated prefix'),
        ('refuse_prefixed_slice_in_band', 'Tensor.__getitem__'),
        ('refuse_prefixed_cat_tokens', 'torch.cat'),
        ('refuse_prefixed_sum_over_tokens', 'Tensor.sum'),
    ],
)  # fmt: skip
def test_a_prefixed_map_refuses_what_it_cannot_do_exactly(results, name, op):
    for out in results:
        assert out[name].startswith('sharded inference: ') and op in out[name], out[name]


def test_local_band_must_match_the_bounds():
    with pytest.raises(ValueError, match='owns rows'):
        BandedMap.from_local(torch.zeros(1, 2, 3, 4), 5)  # one process owns all 5 rows
