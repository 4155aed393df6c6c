"""ShardedCirculantAttention on 2 and 3 gloo ranks against the single-process
CirculantAttention on the whole map (float64), both boundaries.

One run_parallel call per world size computes every case; the tests assemble the bands
here and compare them with the single-process layer run in this process."""

import pytest
import torch

import mmcirc.ops.circulant as circ_ops
from mmcirc.ops.circulant import CirculantAttention
from mmcirc.distributed import band_bounds, run_parallel
from mmcirc.distributed.handlers.circulant import (
    ShardedCirculantAttention,
    ShardedFFT,
    circulant_comm_bytes,
)
from mmcirc.distributed.comm import count_bytes, group_rank_size


pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiny tensors

# name: (B, C, (H, W), num_heads, boundary, scale, one head per block[, dtype]); H = 7 and
# 10 do not divide by 3 (7 not by 2)
CASES = {
    'circular_d1': (2, 4, (7, 5), None, 'circular', 'sqrt_n', False),
    'zero_d1': (2, 4, (7, 5), None, 'zero', 'sqrt_n', False),
    'circular_heads2': (1, 4, (10, 6), 2, 'circular', 'n', False),
    'zero_heads2': (1, 4, (10, 6), 2, 'zero', 'n', False),
    'circular_blocks': (1, 6, (10, 3), 3, 'circular', 'sqrt_n', True),
    'zero_blocks': (2, 3, (10, 3), None, 'zero', 0.3, True),
    'circular_float32': (1, 4, (7, 6), None, 'circular', 'sqrt_n', False, torch.float32),
    'zero_float32': (1, 4, (7, 6), 2, 'zero', 'sqrt_n', False, torch.float32),
}
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def _case(name):
    """(single-process layer, whole input (B, H W, C)), float64 unless the case says,
    seeded by the case."""
    b, c, hw, heads, boundary, scale, _, *dtype = CASES[name]
    dtype = dtype[0] if dtype else torch.float64
    torch.manual_seed(sorted(CASES).index(name))
    layer = CirculantAttention(c, num_heads=heads, boundary=boundary, scale=scale).to(dtype)
    for p in layer.parameters():  # larger than the default init: a peaked softmax
        torch.nn.init.normal_(p, std=1.0)
    return layer.eval(), torch.randn(b, hw[0] * hw[1], c, dtype=dtype)


def _worker():
    rank, size = group_rank_size()
    out = {}
    for name, (_, _, (h, w), _, _, _, tiny_blocks, *_) in CASES.items():
        layer, x = _case(name)
        r0, r1 = band_bounds(h, size)[rank]
        sharded = ShardedCirculantAttention.from_module(layer)
        budget = circ_ops.BLOCK_BYTES
        circ_ops.BLOCK_BYTES = 1 if tiny_blocks else budget  # one head per block
        try:
            with torch.no_grad(), count_bytes() as sent:
                y = sharded(x[:, r0 * w : r1 * w], (h, w))  # (B, h_r W, C)
        finally:
            circ_ops.BLOCK_BYTES = budget
        out[name] = dict(y=y, sent=sent['all_to_all'] + sent['all_reduce'])
    return out


@pytest.fixture(scope='module', params=[2, 3], ids=['P2', 'P3'])
def ranks(request):
    """(P, [per-rank results]) of one run_parallel call."""
    return request.param, run_parallel(_worker, request.param)


@pytest.mark.parametrize('name', list(CASES))
def test_equals_single_process(ranks, name):
    """The bands, concatenated, equal CirculantAttention on the whole map."""
    _, results = ranks
    layer, x = _case(name)
    with torch.no_grad():
        want = layer(x, CASES[name][2])
    got = torch.cat([r[name]['y'] for r in results], dim=1)
    torch.testing.assert_close(got, want, **TOL[x.dtype])


@pytest.mark.parametrize('name', list(CASES))
def test_comm_bytes(ranks, name):
    """circulant_comm_bytes is what the ranks hand to torch.distributed."""
    size, results = ranks
    b, c, hw, heads, boundary, *_ = CASES[name]
    real_bytes = 4 if CASES[name][-1] is torch.float32 else 8
    want = circulant_comm_bytes(b, c, hw, size, heads, boundary, real_bytes=real_bytes)
    assert sum(r[name]['sent'] for r in results) == want


def test_from_module_shares_weights():
    """A drop-in: the same state dict keys, the wrapped layer's very parameters."""
    layer, _ = _case('zero_heads2')
    sharded = ShardedCirculantAttention.from_module(layer)
    assert list(sharded.state_dict()) == list(layer.state_dict())
    assert all(a is b for a, b in zip(sharded.parameters(), layer.parameters()))
    assert (sharded.num_heads, sharded.boundary, sharded.scale) == (2, 'zero', 'n')


def test_single_rank_equals_single_process():
    """Without a process group the layer is the single-process one."""
    layer, x = _case('zero_d1')
    with torch.no_grad():
        got = ShardedCirculantAttention.from_module(layer)(x, (7, 5))
        torch.testing.assert_close(got, layer(x, (7, 5)), **TOL[x.dtype])


def test_band_size_checked():
    """A band that is not this rank's rows of hw_shape is refused with both numbers."""
    layer, x = _case('zero_d1')
    with pytest.raises(ValueError, match=r'N=35 tokens.*hw_shape=\(8, 5\)'):
        ShardedCirculantAttention.from_module(layer)(x, (8, 5))


def test_plan_made_once_per_shape(monkeypatch):
    """The transforms, mask and norms are made once per input shape, not per forward."""
    made, init = [], ShardedFFT.__init__
    monkeypatch.setattr(
        ShardedFFT, '__init__', lambda s, *a, **k: made.append(1) or init(s, *a, **k)
    )
    layer, x = _case('zero_d1')
    sharded = ShardedCirculantAttention.from_module(layer)
    with torch.no_grad():
        for hw in ((7, 5), (7, 5), (5, 7), (7, 5)):
            sharded(x, hw)
    assert len(made) == 2
