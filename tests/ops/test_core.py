"""Core attention against a dense multi-head attention reference."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from dense_reference import core_attention_dense, mha_dense
from mmcirc.ops import CoreAttention, select_cores
from mmcirc.ops.core_softmax import SOFTMAX_WIDTH

FOLDS = [False, True]


def _module(dim=8, num_heads=2, std=0.3, **kwargs):
    """float64 module with non-trivial weights (default init is near zero)."""
    torch.manual_seed(0)
    m = CoreAttention(dim, num_heads, **kwargs).double()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(std=std)
    return m


def _inputs(b=2, n=23, num_cores=5, dim=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, dim, generator=g, dtype=torch.float64)
    cores = torch.randn(b, num_cores, dim, generator=g, dtype=torch.float64)
    return x, cores


# ------------------------------------------------------------ exactness
@pytest.mark.parametrize('fold', FOLDS)
@pytest.mark.parametrize('num_heads', [1, 2])
@pytest.mark.parametrize('num_cores', [1, 16])  # C' = 1 and C' = C_max
def test_matches_dense(fold, num_heads, num_cores):
    m = _module(num_heads=num_heads, fold_projections=fold)
    x, cores = _inputs(num_cores=num_cores)
    y, new_cores = m(x, cores)
    y_ref, cores_ref = core_attention_dense(m, x, cores)
    assert y.shape == x.shape and new_cores.shape == cores.shape
    torch.testing.assert_close(new_cores, cores_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('fold', FOLDS)
def test_gather_is_mha_of_cores_over_patches(fold):
    """The gather alone, checked against a plain MHA (not the whole layer)."""
    m = _module(fold_projections=fold)
    x, cores = _inputs()
    g = m._gather(cores, x, chunk=x.shape[1], fold=fold)
    ref = mha_dense(cores, x, x, m.q_core, m.k_patch, m.v_patch, m.num_heads)
    torch.testing.assert_close(g, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('fold', FOLDS)
def test_broadcast_is_mha_of_patches_over_cores(fold):
    m = _module(fold_projections=fold)
    x, cores = _inputs()
    y = m._broadcast(x, cores, chunk=x.shape[1], fold=fold)
    ref = (
        mha_dense(x, cores, cores, m.q_patch, m.k_core, m.v_core, m.num_heads) @ m.proj.weight.T
        + m.proj.bias
    )
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)


def test_float32_matches_dense():
    m = _module(std=0.2)
    x, cores = _inputs(n=50)
    y_ref, c_ref = core_attention_dense(m, x, cores)
    y, c = m.float()(x.float(), cores.float())
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c.double(), c_ref, rtol=1e-5, atol=1e-5)


def test_no_qkv_bias_matches_dense():
    m = _module(qkv_bias=False)
    x, cores = _inputs()
    for fold in FOLDS:
        m.fold_projections = fold
        torch.testing.assert_close(m(x, cores)[0], core_attention_dense(m, x, cores)[0])


@pytest.mark.parametrize('fold', FOLDS)
@pytest.mark.parametrize('chunk_size', [1, 4, 7, 22])  # N = 23: ragged last
def test_chunked_equals_unchunked(fold, chunk_size):
    m = _module(fold_projections=fold)
    x, cores = _inputs(n=23)
    y, c = m(x, cores)
    m.chunk_size = chunk_size
    y_c, c_c = m(x, cores)
    torch.testing.assert_close(y_c, y, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(c_c, c, rtol=1e-10, atol=1e-12)


def test_chunk_threshold_switches_on_chunking():
    m = _module(chunk_threshold=10)
    assert m._chunk_len(10) == 10 and m._chunk_len(11) < 11
    x, cores = _inputs(n=23)
    y = m(x, cores)[0]
    m.chunk_threshold = 1000
    torch.testing.assert_close(y, m(x, cores)[0])


def test_chunked_online_softmax_is_stable_for_large_scores():
    """Scores of +-1e3: a naive exp would overflow, the running max cannot."""
    m = _module(fold_projections=False, chunk_size=3)
    x, cores = _inputs(n=10)
    x = x * 300
    y, c = m(x, cores)
    assert torch.isfinite(y).all() and torch.isfinite(c).all()
    torch.testing.assert_close(y, core_attention_dense(m, x, cores)[0])


class _MaxNumel(TorchDispatchMode):
    """Largest tensor produced by any op."""

    def __init__(self):
        super().__init__()
        self.max = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.max = max(self.max, t.numel())
        return out


@pytest.mark.parametrize('fold', FOLDS)
def test_chunking_bounds_the_largest_intermediate(fold):
    """With chunks of 64, no (heads, C', N) score map and no full-N k/v."""
    n, dim, num_cores = 1024, 8, 16
    m = CoreAttention(dim, 2, fold_projections=fold, chunk_size=64).eval()
    x = torch.randn(1, n, dim)
    cores = torch.randn(1, num_cores, dim)
    with torch.no_grad(), _MaxNumel() as rec:
        m(x, cores)
    assert rec.max <= n * dim  # the input/output size itself
    # the recorder does see a full (heads * C', N) score map when one is made
    q = torch.randn(1, 2 * num_cores, dim) if fold else torch.randn(1, 2, num_cores, dim // 2)
    with torch.no_grad(), _MaxNumel() as rec:
        m._gather_step(q, x, fold, False, None, None, None, None)
    assert rec.max >= 2 * num_cores * n


@pytest.mark.parametrize('fold', FOLDS)
@pytest.mark.parametrize('chunk_size', [None, 3])
@pytest.mark.parametrize('num_heads', [1, 2])
def test_gradcheck(fold, chunk_size, num_heads):
    m = _module(dim=4, num_heads=num_heads, fold_projections=fold, chunk_size=chunk_size)
    x, cores = _inputs(b=1, n=7, num_cores=2, dim=4)
    x.requires_grad_()
    cores.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, c: m(x, c), (x, cores), fast_mode=True)


def test_chunked_parameter_grads_equal_unchunked():
    m = _module(fold_projections=True)
    x, cores = _inputs(n=23)

    def grads(chunk_size):
        m.chunk_size = chunk_size
        m.zero_grad()
        y, c = m(x, cores)
        (y.square().sum() + c.sum()).backward()
        return [p.grad.clone() for p in m.parameters()]

    for g_c, g in zip(grads(5), grads(None)):
        torch.testing.assert_close(g_c, g)


def test_every_parameter_gets_a_gradient():
    """No dead parameters (DDP would complain)."""
    for fold in FOLDS:
        m = _module(fold_projections=fold)
        x, cores = _inputs()
        y, c = m(x, cores)
        (y.sum() + c.sum()).backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


# ------------------------------------------------------------ softmax over few cores
@pytest.mark.parametrize('num_heads', [1, 2])
@pytest.mark.parametrize('num_cores', [2, 8, 15])
@pytest.mark.parametrize('chunk_size', [None, 4])
def test_few_cores_match_dense(num_heads, num_cores, chunk_size):
    """C' < SOFTMAX_WIDTH: the folded broadcast pads its softmax, still the dense MHA."""
    m = _module(num_heads=num_heads, fold_projections=True, chunk_size=chunk_size)
    x, cores = _inputs(num_cores=num_cores)
    y, new_cores = m(x, cores)
    y_ref, cores_ref = core_attention_dense(m, x, cores)
    torch.testing.assert_close(new_cores, cores_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)


class _SoftmaxInputs(TorchDispatchMode):
    """(last-axis length, dtype) of every softmax's input."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._softmax.default:
            self.seen.append((args[0].shape[-1], args[0].dtype))
        return func(*args, **(kwargs or {}))


def test_few_cores_softmax_runs_over_the_vector_width():
    m = CoreAttention(16, 2, fold_projections=True).eval()
    x, cores = torch.randn(1, 40, 16), torch.randn(1, 8, 16)
    with torch.no_grad(), _SoftmaxInputs() as rec:
        m(x, cores)
    assert rec.seen == [(SOFTMAX_WIDTH, torch.float32)]


@pytest.mark.parametrize('num_cores', [2, 8, 24])
def test_one_head_inference_pads_the_keys_to_the_vector_width(monkeypatch, num_cores):
    """The fused broadcast runs over a multiple of SOFTMAX_WIDTH keys (torch's CPU flash
    kernel is several times slower on other key counts); the padding is masked."""
    import torch.nn.functional as F

    seen, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        seen.append((q.shape[-2], k.shape[-2]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(F, 'scaled_dot_product_attention', recording)
    m = _module(num_heads=1, fold_projections=True).eval()
    x, cores = _inputs(num_cores=num_cores)
    with torch.no_grad():
        m(x, cores)
    keys = [k for q, k in seen if q == x.shape[1]]  # the broadcast: patches are the queries
    assert keys == [-(-num_cores // SOFTMAX_WIDTH) * SOFTMAX_WIDTH]


@pytest.mark.parametrize('num_cores', [1, 2, 3, 8, 16, 24])
@pytest.mark.parametrize('chunk_size', [None, 4])
@pytest.mark.parametrize('qkv_bias', [True, False])
def test_one_head_inference_matches_dense(num_cores, chunk_size, qkv_bias):
    """One head without autograd: the folded broadcast is one fused SDPA (no softmax op of
    its own), still the dense MHA."""
    m = _module(num_heads=1, fold_projections=True, chunk_size=chunk_size, qkv_bias=qkv_bias)
    x, cores = _inputs(num_cores=num_cores)
    with torch.no_grad(), _SoftmaxInputs() as rec:
        y, new_cores = m.eval()(x, cores)
    assert rec.seen == []  # the unchunked gather is SDPA too, the chunked one exp
    y_ref, cores_ref = core_attention_dense(m, x, cores)
    torch.testing.assert_close(new_cores, cores_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('fold', FOLDS)
@pytest.mark.parametrize('chunk_size', [None, 16])
def test_bf16_autocast_keeps_the_softmax_in_float32(fold, chunk_size):
    torch.manual_seed(0)
    m = CoreAttention(32, 2, fold_projections=fold, chunk_size=chunk_size).eval()
    x, cores = torch.randn(1, 50, 32), torch.randn(1, 8, 32)
    with torch.no_grad():
        y32, c32 = m(x, cores)
        with torch.autocast('cpu', torch.bfloat16), _SoftmaxInputs() as rec:
            y16, c16 = m(x, cores)
    assert all(dtype == torch.float32 for _, dtype in rec.seen)
    for a, ref in ((y16, y32), (c16, c32)):
        assert ((a.float() - ref).norm() / ref.norm()).item() < 3e-2


@pytest.mark.parametrize('num_heads', [1, 2])
def test_bf16_autocast_training_step_gradients_near_float32(num_heads):
    torch.manual_seed(0)
    m = CoreAttention(32, num_heads, fold_projections=True)
    x, cores = torch.randn(1, 50, 32), torch.randn(1, 8, 32)

    def grads(autocast):
        m.zero_grad()
        with torch.autocast('cpu', torch.bfloat16, enabled=autocast):
            y, c = m(x, cores)
        (y.float().square().sum() + c.float().sum()).backward()
        return [p.grad for p in m.parameters()]

    for g16, g32 in zip(grads(True), grads(False)):
        assert g16.dtype == torch.float32
        assert ((g16 - g32).norm() / g32.norm()).item() < 5e-2


# ------------------------------------------------------------ elastic cores
def _flops(m, num_cores, n=1024, dim=64):
    x = torch.randn(1, n, dim)
    cores = torch.randn(1, num_cores, dim)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        m(x, cores)
    return fc.get_total_flops()


def test_compute_scales_with_active_cores():
    m = CoreAttention(64, 1)
    assert _flops(m, 8) * 6 < _flops(m, 64)


def test_auto_fold_never_costs_more():
    for heads, num_cores in [(1, 64), (2, 64), (8, 4), (8, 64)]:
        m = CoreAttention(64, heads)
        auto = _flops(m, num_cores)
        m.fold_projections = not m._fold(num_cores)
        assert auto <= _flops(m, num_cores)


def test_select_cores_prefix_and_batch():
    bank = torch.randn(64, 8)
    cores = select_cores(bank, 8, batch_size=3)
    assert cores.shape == (3, 8, 8)
    assert torch.equal(cores[2], bank[:8])
    assert torch.equal(select_cores(bank, 64), bank)


def test_select_cores_is_differentiable():
    bank = torch.randn(16, 4, requires_grad=True)
    select_cores(bank, 3, batch_size=2).sum().backward()
    assert bank.grad[:3].eq(2).all() and bank.grad[3:].eq(0).all()


def test_prefix_cores_work_with_the_layer():
    m = _module(dim=8)
    bank = torch.randn(16, 8, dtype=torch.float64)
    x, _ = _inputs()
    for num_cores in (1, 2, 16):
        cores = select_cores(bank, num_cores, batch_size=2)
        torch.testing.assert_close(m(x, cores)[0], core_attention_dense(m, x, cores)[0])


# ------------------------------------------------------------ bad input
@pytest.mark.parametrize('num_cores', [0, 17, -1, 2.0, True])
def test_select_cores_bad_num_cores(num_cores):
    with pytest.raises(ValueError, match='num_cores must be'):
        select_cores(torch.zeros(16, 4), num_cores)


@pytest.mark.parametrize('bank', [torch.zeros(1, 16, 4), torch.zeros(4)])
def test_select_cores_bad_bank(bank):
    with pytest.raises(ValueError, match='bank must be'):
        select_cores(bank, 1)


@pytest.mark.parametrize(
    'kwargs, match',
    [
        ({'dim': 6, 'num_heads': 4}, 'num_heads must divide'),
        ({'dim': 0, 'num_heads': 1}, 'dim must be'),
        ({'dim': 4, 'num_heads': 0}, 'num_heads must be'),
        ({'dim': 4, 'num_heads': 1, 'chunk_size': 0}, 'chunk_size must be'),
        ({'dim': 4, 'num_heads': 1, 'chunk_threshold': None}, 'chunk_threshold must be'),
        ({'dim': 4, 'num_heads': 1, 'attn_drop': 1.0}, 'attn_drop must be'),
        ({'dim': 4, 'num_heads': 1, 'fold_projections': 'yes'}, 'fold_projections must be'),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CoreAttention(**kwargs)


@pytest.mark.parametrize(
    'x_shape, cores_shape, match',
    [
        ((2, 10, 4), (2, 0, 4), "C' >= 1"),
        ((2, 0, 4), (2, 3, 4), 'N >= 1'),
        ((2, 10, 4), (1, 3, 4), 'cores batch'),
        ((2, 10, 4), (2, 3, 5), 'dim=4'),
        ((2, 10, 5), (2, 3, 4), 'dim=4'),
        ((10, 4), (2, 3, 4), 'x must be a 3-D'),
        ((2, 10, 4), (3, 4), 'cores must be a 3-D'),
    ],
)
def test_bad_input(x_shape, cores_shape, match):
    m = CoreAttention(4, 2)
    with pytest.raises(ValueError, match=match):
        m(torch.zeros(x_shape), torch.zeros(cores_shape))


def test_plan_made_once_per_shape(monkeypatch):
    m = CoreAttention(4, 2).eval()
    made = []
    plan = CoreAttention._new_plan
    monkeypatch.setattr(CoreAttention, '_new_plan', lambda s, *a: made.append(1) or plan(s, *a))
    with torch.no_grad():
        for n in (10, 10, 12, 10):
            m(torch.randn(2, n, 4), torch.randn(2, 3, 4))
    assert len(made) == 2


def test_plan_checks_still_refuse_bad_input_once_cached():
    m = CoreAttention(4, 2).eval()
    with torch.no_grad():
        m(torch.randn(2, 10, 4), torch.randn(2, 3, 4))
        with pytest.raises(ValueError, match='cores batch 1 must equal x batch 2'):
            m(torch.randn(2, 10, 4), torch.randn(1, 3, 4))


# ------------------------------------------------------------ dropout
@pytest.mark.parametrize('fold', FOLDS)
def test_attention_dropout_is_unbiased(fold):
    """E[new cores under attention dropout] = new cores without dropout.

    2000 copies of one sample in a batch draw independent masks."""
    m = _module(dim=4, num_heads=1, attn_drop=0.5, fold_projections=fold, chunk_size=4)
    x, cores = _inputs(b=1, n=9, num_cores=2, dim=4)
    with torch.no_grad():
        c = m.eval()(x, cores)[1]
        torch.manual_seed(0)
        c_drop = m.train()(x.expand(2000, -1, -1), cores.expand(2000, -1, -1))[1]
    assert not torch.allclose(c_drop[0], c[0])
    torch.testing.assert_close(c_drop.mean(0), c[0], rtol=0.03, atol=0.03)


def test_folded_gather_dropout_equals_unfolded():
    """Same dropout mask (same seed, same score layout) -> same new cores,
    so the folded value bias is weighted by the dropped mass exactly."""
    m = _module(dim=4, num_heads=2, attn_drop=0.5, chunk_size=4).train()
    x, cores = _inputs(b=1, n=9, num_cores=3, dim=4)
    out = []
    for fold in FOLDS:
        m.fold_projections = fold
        torch.manual_seed(0)
        out.append(m(x, cores)[1])
    torch.testing.assert_close(out[0], out[1])
