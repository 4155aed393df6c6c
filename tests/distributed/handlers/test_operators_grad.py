"""Backward of the sharded attention operators on 2 and 3 gloo ranks against autograd of
the single-process layers on the whole map (float64): circulant attention (both
boundaries, one and several channels per head, one head per block, a rank without
spectrum columns), core attention
(chunked / unchunked gather, both evaluation orders, a rank without patches) and VECA's
core-periphery attention (the cores a replicated prefix of the banded tokens).

Every rank's band of tokens is a leaf; each rank runs ``backward`` on its part of
L = sum(y * w) (+ sum(new cores * w') / P on every rank, the cores being replicated).
The tests assemble the bands' input gradients, sum the ranks' parameter (and core)
gradients and compare them with the single-process autograd. One run_parallel call per
world size runs every case."""

import pytest
import torch

import mmcirc.ops.circulant as circ_ops
from mmcirc.distributed import BandedMap, band_bounds, run_parallel
from mmcirc.distributed.banded_map import shard_operators
from mmcirc.distributed.comm import group_rank_size
from mmcirc.distributed.handlers import veca  # noqa: F401  (registers the handler)
from mmcirc.models.backbones.veca import CorePeripheryAttention
from mmcirc.ops.circulant import CirculantAttention
from mmcirc.distributed.handlers.circulant import ShardedCirculantAttention
from mmcirc.ops.core import CoreAttention, select_cores
from mmcirc.distributed.handlers.core import ShardedCoreAttention

pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiny tensors

TOL = dict(rtol=1e-10, atol=1e-10)
# name: (B, C, (H, W), num_heads, boundary, one head per block); H = 7, 10 odd splits
CIRC = {
    'circ_circular_d1': (2, 4, (7, 5), None, 'circular', False),
    'circ_zero_d1': (2, 4, (7, 5), None, 'zero', False),
    'circ_circular_heads2': (1, 4, (10, 6), 2, 'circular', False),
    'circ_zero_heads2_blocks': (1, 4, (10, 3), 2, 'zero', True),
    'circ_circular_narrow': (1, 4, (7, 3), None, 'circular', False),  # 2 columns: P = 3
}
# name: (B, C, heads, (H, W), C', layer kwargs)
CORE = {
    'core_unchunked_unfolded': (2, 8, 2, (7, 5), 3, dict(fold_projections=False)),
    'core_unchunked_folded': (2, 8, 2, (7, 5), 3, dict(fold_projections=True)),
    'core_chunked_unfolded': (1, 8, 2, (7, 5), 3, dict(chunk_size=4, fold_projections=False)),
    'core_chunked_folded': (1, 8, 4, (7, 5), 3, dict(chunk_size=4, fold_projections=True)),
    'core_rank_without_patches': (2, 8, 2, (7, 5), 3, dict(chunk_size=4)),
}
# VECA: (B, D, heads, cores C', (H, W))
VECA = {'veca_core_periphery': (2, 8, 2, 3, (7, 4))}
NAMES = list(CIRC) + list(CORE) + list(VECA)


def _seed(name, k=0):
    torch.manual_seed(1000 * k + NAMES.index(name))


def _case(name):
    """(layer, whole inputs: tokens (B, N, C)[, cores (B, C', C)] | VECA's, weights)."""
    _seed(name)
    if name in CIRC:
        b, c, (h, w), heads, boundary, _ = CIRC[name]
        layer = CirculantAttention(c, num_heads=heads, boundary=boundary)
        inputs = dict(x=torch.randn(b, h * w, c))
    elif name in CORE:
        b, c, heads, (h, w), nc, kwargs = CORE[name]
        layer = CoreAttention(c, heads, **kwargs)
        bank = torch.randn(8, c)
        inputs = dict(x=torch.randn(b, h * w, c), cores=select_cores(bank, nc, b))
    else:
        b, d, heads, nc, (h, w) = VECA[name]
        layer = CorePeripheryAttention(d, heads)
        cos, sin = torch.randn(b, nc + h * w, d // heads).chunk(2, -1)
        inputs = dict(
            x=torch.randn(b, nc + h * w, d),
            cos=torch.cat([cos, cos], -1),
            sin=torch.cat([sin, sin], -1),
        )
    for p in layer.parameters():  # larger than the default init: peaked softmaxes
        torch.nn.init.normal_(p, std=0.5)
    layer = layer.double()
    inputs = {k: v.double() for k, v in inputs.items()}
    _seed(name, 1)
    weights = dict(y=torch.randn(inputs['x'].shape, dtype=torch.float64))
    if name in CORE:
        weights['cores'] = torch.randn(inputs['cores'].shape, dtype=torch.float64)
    return layer, inputs, weights


def _rows(name, size):
    """Each rank's token range of x (after VECA's cores)."""
    if name in CIRC:
        h, w = CIRC[name][2]
    elif name in CORE:
        h, w = CORE[name][3]
        if name == 'core_rank_without_patches':  # none on rank 0
            return [(0, 0)] + [(a, b) for a, b in band_bounds(h * w, size - 1)]
    else:
        h, w = VECA[name][4]
    return [(a * w, b * w) for a, b in band_bounds(h, size)]


def _run_rank(name, layer, inputs, weights, rank, size):
    """This rank's (input leaves, loss part)."""
    t0, t1 = _rows(name, size)[rank]
    x = inputs['x']
    if name in CIRC:
        (h, w), budget = CIRC[name][2], circ_ops.BLOCK_BYTES
        leaf = x[:, t0:t1].clone().requires_grad_()
        circ_ops.BLOCK_BYTES = 1 if CIRC[name][5] else budget  # one head per block
        try:
            y = ShardedCirculantAttention.from_module(layer)(leaf, (h, w))
        finally:
            circ_ops.BLOCK_BYTES = budget
        return dict(x=leaf), (y * weights['y'][:, t0:t1]).sum()
    if name in CORE:
        leaf = x[:, t0:t1].clone().requires_grad_()
        cores = inputs['cores'].clone().requires_grad_()
        y, new = ShardedCoreAttention.from_module(layer)(leaf, cores)
        loss = (y * weights['y'][:, t0:t1]).sum() + (new * weights['cores']).sum() / size
        return dict(x=leaf, cores=cores), loss
    nc, (h, w) = VECA[name][3], VECA[name][4]
    shard_operators(layer)
    prefix = x[:, :nc].clone().requires_grad_()
    leaf = x[:, nc + t0 : nc + t1].clone().requires_grad_()
    tokens = torch.cat([prefix, BandedMap.from_local(leaf, h, band_dim=1, unit=w)], 1)
    y = layer(tokens, inputs['cos'], inputs['sin'], nc)  # banded, the cores its prefix
    wy = weights['y']
    loss = (y.local[:, nc:] * wy[:, nc + t0 : nc + t1]).sum()
    loss = loss + (y.local[:, :nc] * wy[:, :nc]).sum() / size  # the replicated cores
    return dict(prefix=prefix, x=leaf), loss


def _worker():
    rank, size = group_rank_size()
    out = {}
    for name in NAMES:
        layer, inputs, weights = _case(name)
        leaves, loss = _run_rank(name, layer, inputs, weights, rank, size)
        loss.backward()
        out[name] = dict(
            inputs={k: v.grad for k, v in leaves.items()},
            params={n: p.grad for n, p in layer.named_parameters()},
        )
    return out


@pytest.fixture(scope='module', params=[2, 3], ids=['P2', 'P3'])
def ranks(request):
    return run_parallel(_worker, request.param, start_method='forkserver')


def _reference(name):
    """The single-process layer after backward, and its inputs' gradients."""
    layer, inputs, weights = _case(name)
    for v in inputs.values():
        v.requires_grad_()
    if name in CIRC:
        y = layer(inputs['x'], CIRC[name][2])
        loss = (y * weights['y']).sum()
    elif name in CORE:
        y, new = layer(inputs['x'], inputs['cores'])
        loss = (y * weights['y']).sum() + (new * weights['cores']).sum()
    else:
        nc = VECA[name][3]
        y = layer(inputs['x'], inputs['cos'], inputs['sin'], nc)
        loss = (y * weights['y']).sum()
    loss.backward()
    return layer, inputs


@pytest.mark.parametrize('name', NAMES)
def test_input_gradients_equal_single_process(ranks, name):
    """The bands' token gradients, assembled (and the replicated cores' summed over
    the ranks), equal autograd's on the whole map."""
    _, inputs = _reference(name)
    got = torch.cat([r[name]['inputs']['x'] for r in ranks], 1)
    if name in VECA:
        got = torch.cat([sum(r[name]['inputs']['prefix'] for r in ranks), got], 1)
    torch.testing.assert_close(got, inputs['x'].grad, **TOL)
    if name in CORE:
        cores = sum(r[name]['inputs']['cores'] for r in ranks)
        torch.testing.assert_close(cores, inputs['cores'].grad, **TOL)


@pytest.mark.parametrize('name', NAMES)
def test_parameter_gradients_summed_equal_single_process(ranks, name):
    """Every parameter's gradient summed over the ranks equals autograd's."""
    layer, _ = _reference(name)
    for n, p in layer.named_parameters():
        got = [r[name]['params'][n] for r in ranks]
        assert (p.grad is None) == all(g is None for g in got), n
        if p.grad is not None:
            got = sum(g for g in got if g is not None)
            torch.testing.assert_close(got, p.grad, **TOL, msg=lambda s, n=n: f'{n}: {s}')


@pytest.mark.parametrize('name', list(CIRC))
def test_every_rank_holds_every_circulant_parameter_gradient(ranks, name):
    """A rank that owns no spectrum columns (2 half-spectrum columns at P = 3) still
    holds a (zero) gradient of the weights, so that the ranks' gradient sets agree."""
    for r in ranks:
        assert all(g is not None for g in r[name]['params'].values())
