"""Backward of the row-banded handlers and collectives on 2 and 3 gloo ranks against
autograd of the single-process ops on the whole map (float64).

Each case is a small module run on a BandedMap whose local band is a leaf; every rank
runs ``backward`` on its part of the loss L = sum(output * weights) (its band of a
banded output; a replicated output enters every rank's part divided by P). The tests
assemble the bands' input gradients, sum the ranks' parameter gradients and compare
both with autograd of the same module on the whole map in this process. Heights (7, 11,
13) do not divide by 2 or 3. One run_parallel call per world size runs every case.
"""

import pytest
import torch
import torch.nn.functional as F
from mmdet.models.backbones.pvt import SpatialReductionAttention
from torch import nn

from mmcirc.distributed import BandedMap, band_bounds, run_parallel
from mmcirc.distributed.comm import Layout, exchange_rows, gather_rows, group_rank_size
from mmcirc.distributed.fft import sharded_irfft2, sharded_rfft2, spectrum_columns

TOL = dict(rtol=1e-10, atol=1e-10)


class Op(nn.Module):
    """``fn(x, *modules)`` with the modules' parameters registered."""

    def __init__(self, fn, *modules):
        super().__init__()
        self.fn, self.mods = fn, nn.ModuleList(modules)

    def forward(self, x):
        return self.fn(x, *self.mods)


def _tokens_roundtrip(m, ln, lin):  # (B, C, H, W) -> tokens -> LN, Linear -> map
    b, _, h, w = m.shape
    t = lin(ln(m.flatten(2).transpose(1, 2)))  # (B, HW, 3)
    return t.transpose(1, 2).reshape(b, 3, h, w)


def _pooled_branch(m, conv):  # PSP-style: pool, 1x1 conv, resize back, concatenate
    p = conv(F.adaptive_avg_pool2d(m, 2))
    return torch.cat([m, F.interpolate(p, m.shape[2:], mode='bilinear')], 1)


class Prefixed(nn.Module):
    """A replicated prefix of 2 learnt tokens (VECA's cores) before the banded tokens."""

    def __init__(self, c):
        super().__init__()
        self.prefix, self.lin = nn.Parameter(torch.zeros(1, 2, c)), nn.Linear(c, c)

    def forward(self, t):
        y = self.lin(torch.cat([self.prefix.expand(t.shape[0], -1, -1), t], 1))  # (B, 2+N, C)
        return y[:, 2:] * y[:, :2].sum(1, keepdim=True).sigmoid()


# name: (input kind, shape: (B, C, H, W) map or (B, H, W, C) -> tokens (B, H W, C), builder)
CASES = {
    'conv3x3_p1': ('map', (2, 4, 11, 6), lambda: nn.Conv2d(4, 5, 3, padding=1)),
    'conv3x3_s2_p1': ('map', (1, 4, 11, 7), lambda: nn.Conv2d(4, 5, 3, stride=2, padding=1)),
    'conv7x7_s4_p3': ('map', (1, 3, 13, 9), lambda: nn.Conv2d(3, 4, 7, stride=4, padding=3)),
    'conv_dw_dilated': ('map', (1, 4, 13, 6),
                        lambda: nn.Conv2d(4, 4, (5, 3), padding=(2, 1), dilation=(2, 1), groups=4)),
    'conv1x1_local': ('map', (1, 4, 7, 5), lambda: nn.Conv2d(4, 3, 1)),
    'pad_rows_cols': ('map', (1, 4, 11, 6),
                      lambda: Op(lambda m, c: c(F.pad(m, (1, 2, 3, 1))), nn.Conv2d(4, 2, 3))),
    'interp_bilinear_up': ('map', (1, 3, 7, 5),
                           lambda: Op(lambda m: F.interpolate(m, (23, 9), mode='bilinear'))),
    'interp_bilinear_ac': ('map', (1, 3, 7, 5), lambda: Op(
        lambda m: F.interpolate(m, (29, 11), mode='bilinear', align_corners=True))),
    'interp_bilinear_down': ('map', (1, 3, 13, 9),
                             lambda: Op(lambda m: F.interpolate(m, scale_factor=0.5, mode='bilinear'))),
    'interp_nearest_scale': ('map', (1, 3, 7, 5),
                             lambda: Op(lambda m: F.interpolate(m, scale_factor=2.5, mode='nearest'))),
    'interp_nearest_down': ('map', (1, 3, 13, 9),
                            lambda: Op(lambda m: F.interpolate(m, (7, 5), mode='nearest'))),
    'adaptive_pool_replicated': ('map', (2, 3, 11, 5),
                                 lambda: Op(lambda m: F.adaptive_avg_pool2d(m, (3, 2)))),
    'pooled_branch_cat': ('map', (1, 4, 11, 6), lambda: Op(_pooled_branch, nn.Conv2d(4, 2, 1))),
    'group_norm': ('map', (2, 4, 11, 5), lambda: nn.GroupNorm(2, 4)),
    'batch_norm_train': ('map', (2, 4, 11, 5), lambda: nn.BatchNorm2d(4, momentum=0.3)),
    'batch_norm_eval': ('map', (2, 4, 11, 5), lambda: nn.BatchNorm2d(4).eval()),
    'batch_norm_train_no_affine': ('map', (1, 3, 7, 3), lambda: nn.BatchNorm2d(3, affine=False)),
    'tokens_roundtrip': ('map', (1, 4, 11, 6),
                         lambda: Op(_tokens_roundtrip, nn.LayerNorm(4), nn.Linear(4, 3))),
    'nhwc_permute': ('map', (1, 4, 11, 6),
                     lambda: Op(lambda m, ln: ln(m.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
                                nn.LayerNorm(4))),
    'chunk_slice_cat': ('map', (1, 4, 11, 6), lambda: Op(
        lambda m: torch.cat([m.chunk(2, 1)[0] * m[:, 2:].sigmoid(), m[..., :, :] * 2], 1))),
    'sra_mha_gathered_keys': ('tokens', (2, 11, 4, 8),
                              lambda: SpatialReductionAttention(8, 2, sr_ratio=2)),
    'prefix_tokens': ('tokens', (2, 7, 3, 6), lambda: Prefixed(6)),
}  # fmt: skip
NAMES = list(CASES)


def _case(name):
    """(module in float64 with seeded parameters, whole input, output weights)."""
    kind, shape, build = CASES[name]
    torch.manual_seed(NAMES.index(name))
    m = build()
    for p in m.parameters():
        nn.init.normal_(p)
    m = m.double()
    x = torch.randn(shape, dtype=torch.float64)
    if kind == 'tokens':
        x = x.flatten(1, 2)  # (B, H W, C)
    return m, x


def _call(m, name, x):
    if CASES[name][0] == 'tokens':
        return m(x, CASES[name][1][1:3]) if isinstance(m, SpatialReductionAttention) else m(x)
    return m(x)


def _weights(name, shape):
    torch.manual_seed(1000 + NAMES.index(name))
    return torch.randn(shape, dtype=torch.float64)


def _band_leaf(name, x, rank, size):
    """This rank's band of x as a leaf, and the BandedMap around it."""
    kind, shape = CASES[name][:2]
    h = shape[2] if kind == 'map' else shape[1]
    a, b = band_bounds(h, size)[rank]
    if kind == 'map':
        leaf = x[:, :, a:b].clone().requires_grad_()
        return leaf, BandedMap.from_local(leaf, h, band_dim=2)
    w = shape[2]
    leaf = x[:, a * w : b * w].clone().requires_grad_()
    return leaf, BandedMap.from_local(leaf, h, band_dim=1, unit=w)


def _local_loss(y, name):
    """This rank's part of sum(y * weights)."""
    w = _weights(name, y.shape)
    if isinstance(y, BandedMap):
        return (y.local * y.cut(w, y.band_dim)).sum()
    return (y * w).sum() / group_rank_size()[1]  # replicated: 1/P on every rank


def _handler_cases(out):
    rank, size = group_rank_size()
    for name in NAMES:
        m, x = _case(name)
        leaf, xb = _band_leaf(name, x, rank, size)
        y = _call(m, name, xb)
        _local_loss(y, name).backward()
        with torch.no_grad():
            full = y.full_tensor() if isinstance(y, BandedMap) else y
        out[name] = dict(
            y=full.detach(),
            x_grad=leaf.grad,
            grads={n: p.grad for n, p in m.named_parameters()},
            buffers={n: b.clone() for n, b in m.named_buffers()},
        )


# --------------------------------------------------------------------------- comm / fft
# exchange: (map (B, C, H, W), every rank's wanted rows as a function of P): halos past
# both ends of the map, overlapping requests, a rank wanting nothing
EXCHANGES = {
    'halos_past_the_map': ((1, 2, 7, 3), lambda p: [(-2 + 3 * q, 4 + 3 * q) for q in range(p)]),
    'all_want_rows_1_5': ((2, 1, 11, 2), lambda p: [(1, 5)] * p),
    'last_wants_nothing': ((1, 2, 13, 2), lambda p: [(0, 13)] * (p - 1) + [(0, 0)]),
}
# fft: (B, C, rows, W), grid (Ph, Pw): the circular grid and a zero-padded one
FFTS = {'grid_circular': ((1, 2, 7, 5), (7, 5)), 'grid_padded': ((2, 1, 11, 6), (21, 11))}


def _seeded(key, shape, dtype=torch.float64):
    torch.manual_seed(sum(map(ord, key)))
    return torch.randn(shape, dtype=dtype)


def _comm_cases(out):
    rank, size = group_rank_size()
    for name, (shape, wants) in EXCHANGES.items():
        x, h = _seeded(name, shape), shape[2]
        a, b = band_bounds(h, size)[rank]
        leaf = x[:, :, a:b].clone().requires_grad_()
        got = exchange_rows(leaf, Layout.of(h, size, rank), wants(size), dim=2)
        lo, hi = wants(size)[rank]
        w = _seeded(name + 'w', (*shape[:2], 40, shape[3]))[:, :, 20 + lo : 20 + hi]
        (got * w).sum().backward()
        out[name] = leaf.grad
    x = _seeded('gather', (2, 11, 3))  # gather_rows along dim 1, to every rank
    a, b = band_bounds(11, size)[rank]
    leaf = x[:, a:b].clone().requires_grad_()
    whole = gather_rows(leaf, Layout.of(11, size, rank), dim=1)
    ((whole * _seeded('gatherw', x.shape)).sum() / size).backward()
    out['gather_rows'] = leaf.grad
    for name, (shape, grid) in FFTS.items():
        x, h = _seeded(name, shape), shape[2]
        a, b = band_bounds(h, size)[rank]
        c0, c1 = spectrum_columns(grid, size)[rank]
        leaf = x[:, :, a:b].clone().requires_grad_()
        z = sharded_rfft2(leaf, h, grid)  # (B, C, Ph, u_r)
        w = _seeded(name + 'w', (*shape[:2], grid[0], grid[1] // 2 + 1), torch.complex128)
        torch.view_as_real(z * w[..., c0:c1]).sum().backward()
        zs = _seeded(name + 'z', w.shape, torch.complex128)
        zleaf = zs[..., c0:c1].clone().requires_grad_()
        back = sharded_irfft2(zleaf, h, grid, shape[3])  # (B, C, h_r, W)
        (back * _seeded(name + 'v', shape)[:, :, a:b]).sum().backward()
        out[name] = dict(x_grad=leaf.grad, z_grad=zleaf.grad)


def _worker():
    out = {}
    _handler_cases(out)
    _comm_cases(out)
    return out


@pytest.fixture(scope='module', params=[2, 3], ids=['P2', 'P3'])
def ranks(request):
    return run_parallel(_worker, request.param, start_method='forkserver')


def _reference(name):
    m, x = _case(name)
    x.requires_grad_()
    y = _call(m, name, x)
    (y * _weights(name, y.shape)).sum().backward()
    return m, x, y


def _cat_bands(ranks, name, key):
    dim = 2 if CASES[name][0] == 'map' else 1
    return torch.cat([r[name][key] for r in ranks], dim)


@pytest.mark.parametrize('name', NAMES)
def test_forward_equals_single_process(ranks, name):
    """The forward in training mode (BatchNorm's batch statistics) is the whole map's."""
    _, _, y = _reference(name)
    torch.testing.assert_close(ranks[0][name]['y'], y.detach(), **TOL)


@pytest.mark.parametrize('name', NAMES)
def test_input_gradient_equals_single_process(ranks, name):
    """The bands' input gradients, assembled, equal autograd's on the whole map."""
    _, x, _ = _reference(name)
    torch.testing.assert_close(_cat_bands(ranks, name, 'x_grad'), x.grad, **TOL)


@pytest.mark.parametrize('name', [n for n in NAMES if list(_case(n)[0].parameters())])
def test_parameter_gradients_summed_equal_single_process(ranks, name):
    """Every parameter's gradient summed over the ranks (None: a rank whose band took
    no part, e.g. an empty output band) equals autograd's."""
    m, _, _ = _reference(name)
    for n, p in m.named_parameters():
        got = sum(r[name]['grads'][n] for r in ranks if r[name]['grads'][n] is not None)
        torch.testing.assert_close(got, p.grad, **TOL, msg=lambda s, n=n: f'{n}: {s}')


@pytest.mark.parametrize('name', ['batch_norm_train', 'batch_norm_train_no_affine'])
def test_batch_norm_running_stats_equal_single_process_on_every_rank(ranks, name):
    """Training BatchNorm on bands updates the running statistics (and the batch
    count) as one process on the whole map does, identically on every rank."""
    m, _, _ = _reference(name)
    for n, b in m.named_buffers():
        for r in ranks:
            torch.testing.assert_close(r[name]['buffers'][n], b, **TOL, msg=n)
        assert all(torch.equal(r[name]['buffers'][n], ranks[0][name]['buffers'][n]) for r in ranks)


@pytest.mark.parametrize('name', list(EXCHANGES))
def test_exchange_rows_adjoint_returns_halo_gradients_to_owners(ranks, name):
    """Every rank's requested rows (halos, rows past the map as zeros) weighted by its
    own weights: the band gradients, assembled, equal the single-process ones."""
    shape, wants = EXCHANGES[name]
    x = _seeded(name, shape).requires_grad_()
    pad = F.pad(x, (0, 0, 20, 40 - 20 - shape[2]))  # rows -20 .. 20 (zeros past the map)
    w = _seeded(name + 'w', (*shape[:2], 40, shape[3]))
    loss = sum((pad[:, :, 20 + lo : 20 + hi] * w[:, :, 20 + lo : 20 + hi]).sum()
               for lo, hi in wants(len(ranks)))  # fmt: skip
    loss.backward()
    torch.testing.assert_close(torch.cat([r[name] for r in ranks], 2), x.grad, **TOL)


def test_gather_rows_gradient_sums_every_rank(ranks):
    x = _seeded('gather', (2, 11, 3)).requires_grad_()
    (x * _seeded('gatherw', x.shape)).sum().backward()  # each rank holds it, 1/P each
    torch.testing.assert_close(torch.cat([r['gather_rows'] for r in ranks], 1), x.grad, **TOL)


@pytest.mark.parametrize('name', list(FFTS))
def test_distributed_fft_gradients_equal_torch_fft(ranks, name):
    """sharded_rfft2's input gradient and sharded_irfft2's spectrum gradient (the
    adjoint transforms) equal autograd of torch.fft.rfft2 / irfft2 on the whole map."""
    shape, grid = FFTS[name]
    x = _seeded(name, shape).requires_grad_()
    w = _seeded(name + 'w', (*shape[:2], grid[0], grid[1] // 2 + 1), torch.complex128)
    torch.view_as_real(torch.fft.rfft2(x, s=grid) * w).sum().backward()
    z = _seeded(name + 'z', w.shape, torch.complex128).requires_grad_()
    back = torch.fft.irfft2(z, s=grid)[..., : shape[2], : shape[3]]
    (back * _seeded(name + 'v', shape)).sum().backward()
    torch.testing.assert_close(torch.cat([r[name]['x_grad'] for r in ranks], 2), x.grad, **TOL)
    torch.testing.assert_close(torch.cat([r[name]['z_grad'] for r in ranks], 3), z.grad, **TOL)
