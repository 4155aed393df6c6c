"""ShardedCoreAttention on 2 and 3 gloo ranks against the single-process CoreAttention
on all patches (float64): chunked and unchunked gather, both evaluation orders, elastic C'.

One run_parallel call per world size computes every case; the tests assemble the bands
here and compare them with the single-process layer run in this process."""

import pytest
import torch

from mmcirc.ops.core import CoreAttention, select_cores
from mmcirc.distributed import band_bounds, run_parallel
from mmcirc.distributed.handlers.core import ShardedCoreAttention, core_comm_bytes
from mmcirc.distributed.comm import count_bytes, group_rank_size


pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiny tensors

BANK = 8  # cores in the bank; C' is a prefix
# name: (B, C, heads, (H, W), C', layer kwargs); H = 7 does not divide by 2 or 3
CASES = {
    'unchunked_unfolded': (2, 8, 2, (7, 5), 3, dict(fold_projections=False)),
    'unchunked_folded': (2, 8, 2, (7, 5), 3, dict(fold_projections=True)),
    'chunked_unfolded': (2, 8, 2, (7, 5), 3, dict(chunk_size=4, fold_projections=False)),
    'chunked_folded': (2, 8, 4, (7, 5), 3, dict(chunk_size=4, fold_projections=True)),
    'chunk_threshold': (1, 8, 2, (10, 3), 5, dict(chunk_threshold=4)),
    'elastic_1_core': (1, 8, 2, (7, 5), 1, dict(chunk_size=3)),
    'elastic_all_cores': (1, 8, 2, (7, 5), BANK, dict(chunk_size=3)),
    'rank_without_patches': (2, 8, 2, (7, 5), 3, dict(chunk_size=4)),
}
TOL = dict(rtol=1e-10, atol=1e-10)


def _case(name):
    """(single-process layer, patches (B, N, C), active cores (B, C', C)), float64."""
    b, c, heads, (h, w), num_cores, kwargs = CASES[name]
    torch.manual_seed(sorted(CASES).index(name))
    layer = CoreAttention(c, heads, **kwargs).double().eval()
    for p in layer.parameters():  # larger than the default init: peaked softmaxes
        torch.nn.init.normal_(p, std=0.5)
    bank = torch.randn(BANK, c, dtype=torch.float64)
    x = torch.randn(b, h * w, c, dtype=torch.float64)
    return layer, x, select_cores(bank, num_cores, b)


def _token_bounds(name, size):
    """Each rank's patches: whole rows of the H x W map (band_bounds), or, for
    'rank_without_patches', none on rank 0 and the N patches split over the others."""
    h, w = CASES[name][3]
    if name == 'rank_without_patches':
        return [(0, 0)] + band_bounds(h * w, size - 1)
    return [(a * w, b * w) for a, b in band_bounds(h, size)]


def _worker():
    rank, size = group_rank_size()
    out = {}
    for name in CASES:
        layer, x, cores = _case(name)
        t0, t1 = _token_bounds(name, size)[rank]
        sharded = ShardedCoreAttention.from_module(layer)
        with torch.no_grad(), count_bytes() as sent:
            y, new_cores = sharded(x[:, t0:t1], cores)  # (B, n_r, C), (B, C', C)
        out[name] = dict(y=y, cores=new_cores, sent=sent['all_reduce'])
    return out


@pytest.fixture(scope='module', params=[2, 3], ids=['P2', 'P3'])
def ranks(request):
    """(P, [per-rank results]) of one run_parallel call."""
    return request.param, run_parallel(_worker, request.param)


@pytest.mark.parametrize('name', list(CASES))
def test_patches_equal_single_process(ranks, name):
    """The patch outputs of the ranks, concatenated, equal CoreAttention on all patches."""
    _, results = ranks
    layer, x, cores = _case(name)
    with torch.no_grad():
        want, _ = layer(x, cores)
    got = torch.cat([r[name]['y'] for r in results], dim=1)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize('name', list(CASES))
def test_cores_equal_single_process(ranks, name):
    """Every rank's updated cores equal the single-process ones (the exact gather)."""
    _, results = ranks
    layer, x, cores = _case(name)
    with torch.no_grad():
        _, want = layer(x, cores)
    for r in results:
        torch.testing.assert_close(r[name]['cores'], want, **TOL)


@pytest.mark.parametrize('name', list(CASES))
def test_cores_identical_on_every_rank(ranks, name):
    """The core residual stream is bitwise the same on every rank."""
    _, results = ranks
    assert all(torch.equal(r[name]['cores'], results[0][name]['cores']) for r in results)


@pytest.mark.parametrize('name', list(CASES))
def test_comm_bytes(ranks, name):
    """core_comm_bytes is each rank's all_reduce payload (it scales with C', not N)."""
    _, results = ranks
    b, c, heads, _, num_cores, _ = CASES[name]
    want = core_comm_bytes(b, c, heads, num_cores, real_bytes=8)
    assert [r[name]['sent'] for r in results] == [want] * len(results)


def test_from_module_shares_weights():
    """A drop-in: the same state dict keys, the wrapped layer's very parameters."""
    layer, _, _ = _case('chunked_folded')
    sharded = ShardedCoreAttention.from_module(layer)
    assert list(sharded.state_dict()) == list(layer.state_dict())
    assert all(a is b for a, b in zip(sharded.parameters(), layer.parameters()))
    assert (sharded.chunk_size, sharded.fold_projections) == (4, True)


def test_single_rank_equals_single_process():
    """Without a process group the layer is the single-process one."""
    layer, x, cores = _case('chunked_unfolded')
    with torch.no_grad():
        got = ShardedCoreAttention.from_module(layer)(x, cores)
        want = layer(x, cores)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
