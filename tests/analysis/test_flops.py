"""FLOP handles of mmcirc.analysis against analytic counts written out here.

Convention under test (mmcirc/analysis/flops.py): MACs; complex FFT of n points
= 2.5 n log2 n, real-input FFT / inverse to real = 1.25 n log2 n (n = points of
one transform, real log2 for any n); complex x complex = 4 per element,
complex x real = 2; softmax / exp = 1 per element; SDPA = B Lq Lk (E + Ev)
plus B Lq Lk softmax. Every expected number below is computed from these
formulas, never with the module's own helpers.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmcirc.analysis import count_flops, flop_counter, register_flop_handles
from mmcirc.ops import CirculantAttention, CoreAttention


def nlogn(n):
    return n * math.log2(n) if n > 1 else 0.0


def cfft(n):  # one complex FFT of n points
    return 2.5 * nlogn(n)


def rfft(n):  # one real-input FFT (or inverse to real) of n points
    return 1.25 * nlogn(n)


class Fn(nn.Module):
    """Wrap a function of tensors as a module (the counter traces modules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def ops(fn, *inputs):
    fc = flop_counter(Fn(fn), tuple(inputs))
    return fc.total(), fc.by_operator()


# --------------------------------------------------------------- FFT handles
SIZES = [(8, 8), (14, 14), (7, 11), (16, 5), (1, 6)]


@pytest.mark.parametrize('hw', SIZES)
def test_rfft2_irfft2(hw):
    b, c = 2, 3
    h, w = hw
    x = torch.randn(b, c, h, w)
    total, by_op = ops(lambda t: torch.fft.rfft2(t), x)
    assert total == pytest.approx(b * c * rfft(h * w))
    assert set(by_op) <= {'fft'}
    spec = torch.fft.rfft2(x)
    total, _ = ops(lambda t: torch.fft.irfft2(t, s=(h, w)), spec)
    assert total == pytest.approx(b * c * rfft(h * w))


@pytest.mark.parametrize('hw', SIZES)
def test_complex_2d_and_nd(hw):
    b, c = 2, 3
    h, w = hw
    x = torch.randn(b, c, h, w)
    z = torch.randn(b, c, h, w, dtype=torch.complex64)
    assert ops(lambda t: torch.fft.fft2(t), z)[0] == pytest.approx(b * c * cfft(h * w))
    assert ops(lambda t: torch.fft.ifft2(t), z)[0] == pytest.approx(b * c * cfft(h * w))
    # fftn without dim transforms every axis: one transform of b*c*h*w points
    assert ops(lambda t: torch.fft.fftn(t), z)[0] == pytest.approx(cfft(b * c * h * w))
    assert ops(lambda t: torch.fft.rfftn(t, dim=(-2, -1)), x)[0] == pytest.approx(
        b * c * rfft(h * w)
    )
    spec = torch.fft.rfftn(x, dim=(-2, -1))
    assert ops(lambda t: torch.fft.irfftn(t, s=(h, w), dim=(-2, -1)), spec)[0] == pytest.approx(
        b * c * rfft(h * w)
    )


def test_1d_with_padding():
    """n= pads the transform: rfft over W padded to 20 on b*c*h rows, then a
    complex fft over H padded to 30 on the 11 spectrum columns."""
    b, c, h, w = 2, 3, 8, 10
    x = torch.randn(b, c, h, w)
    total, _ = ops(lambda t: torch.fft.rfft(t, n=20, dim=-1), x)
    assert total == pytest.approx(b * c * h * rfft(20))
    total, _ = ops(lambda t: torch.fft.fft(torch.fft.rfft(t, n=20, dim=-1), n=30, dim=-2), x)
    assert total == pytest.approx(b * c * h * rfft(20) + b * c * 11 * cfft(30))
    spec = torch.randn(b, c, 30, 11, dtype=torch.complex64)
    total, _ = ops(lambda t: torch.fft.irfft(torch.fft.ifft(t, dim=-2), n=20), spec)
    assert total == pytest.approx(b * c * 11 * cfft(30) + b * c * 30 * rfft(20))


def test_fft_is_not_zero_and_plain_mmengine_misses_it():
    from mmengine.analysis import FlopAnalyzer

    x = torch.randn(1, 4, 16, 16)
    m = Fn(lambda t: torch.fft.irfft2(torch.fft.rfft2(t), s=(16, 16)))
    plain = FlopAnalyzer(m, (x,))
    plain.unsupported_ops_warnings(False)
    assert plain.total() == 0
    assert count_flops(m, x) == pytest.approx(2 * 4 * 1.25 * 256 * 8)


# --------------------------------------------------------- other handles
def test_complex_multiply():
    z = torch.randn(2, 3, 5, 4, dtype=torch.complex64)
    r = torch.randn(2, 3, 5, 4)
    assert ops(lambda a, b: a.conj() * b, z, z)[0] == 4 * z.numel()
    assert ops(lambda a, b: a * b, z, r)[0] == 2 * z.numel()
    assert ops(lambda a, b: a * b, r, r)[0] == 0  # real elementwise: free
    # broadcast: (2, 1, 5, 4) x (2, 3, 5, 4) -> output elements count
    assert ops(lambda a, b: a[:, :1] * b, z, z)[0] == 4 * z.numel()


def test_softmax():
    x = torch.randn(2, 3, 7, 9)
    assert ops(lambda t: torch.softmax(t, -1), x)[0] == x.numel()
    assert ops(lambda t: F.log_softmax(t, 1), x)[0] == x.numel()
    assert ops(lambda t: t.softmax(-1).softmax(-2), x)[0] == 2 * x.numel()


@pytest.mark.parametrize('lq,lk,e,ev', [(10, 7, 8, 8), (5, 12, 4, 6)])
def test_sdpa(lq, lk, e, ev):
    b, h = 2, 3
    q, k, v = torch.randn(b, h, lq, e), torch.randn(b, h, lk, e), torch.randn(b, h, lk, ev)
    total, by_op = ops(F.scaled_dot_product_attention, q, k, v)
    assert by_op['sdpa'] == b * h * lq * lk * e + b * h * lq * lk * ev
    assert by_op['softmax'] == b * h * lq * lk
    # equals the explicit formulation counted by matmul + softmax handles
    ref, _ = ops(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ v, q, k, v)
    assert total == ref


def test_matmul_broadcast_and_baddbmm():
    b, c, m = 3, 8, 20
    w, x = torch.randn(3 * c, c), torch.randn(b, c, m)
    # mmengine's own handle drops the batch of x here (3*c*c*m)
    assert ops(torch.matmul, w, x)[0] == b * 3 * c * c * m
    a4, w3 = torch.randn(b, 2, 5, 4), torch.randn(2, 4, 6)
    assert ops(torch.matmul, a4, w3)[0] == b * 2 * 5 * 4 * 6
    v1 = torch.randn(4)
    assert ops(torch.matmul, a4, v1)[0] == b * 2 * 5 * 4
    bias, p, q = torch.randn(b, 1, 6), torch.randn(b, 5, 4), torch.randn(b, 4, 6)
    assert ops(torch.baddbmm, bias, p, q)[0] == b * 5 * 4 * 6


def test_einsum_from_mmengine():
    q, k = torch.randn(2, 3, 10, 4), torch.randn(2, 3, 7, 4)
    total, _ = ops(lambda a, b: torch.einsum('bhnd,bhmd->bhnm', a, b), q, k)
    assert total == 2 * 3 * 10 * 7 * 4


def test_register_flop_handles_for_mmengine_helpers():
    from mmengine.analysis import get_model_complexity_info

    m = Fn(lambda t: torch.fft.rfft2(t))
    with register_flop_handles():
        inside = get_model_complexity_info(
            m, inputs=(torch.randn(1, 2, 8, 8),), show_table=False, show_arch=False
        )
    after = get_model_complexity_info(
        m, inputs=(torch.randn(1, 2, 8, 8),), show_table=False, show_arch=False
    )
    assert inside['flops'] == pytest.approx(2 * 1.25 * 64 * 6)
    assert after['flops'] == 0


# ------------------------------------------------- circulant attention module
PRODUCTS = ('linear', 'matmul', 'mm', 'addmm', 'bmm', 'baddbmm', 'einsum', 'sdpa')


def grouped(by_op):
    """Counts grouped by what they compute, independent of which torch op a
    module uses for it (nn.Linear vs bmm on its weight, SDPA vs matmuls)."""
    return dict(
        products=sum(by_op.get(k, 0) for k in PRODUCTS),
        softmax=by_op.get('softmax', 0) + by_op.get('exp', 0),
        fft=by_op.get('fft', 0),
        complex_mul=by_op.get('complex_mul', 0),
        other=sum(
            v
            for k, v in by_op.items()
            if k not in PRODUCTS and k not in ('softmax', 'exp', 'fft', 'complex_mul')
        ),
    )


def assert_groups(by_op, expected):
    got = grouped(by_op)
    for key in ('products', 'softmax', 'fft', 'complex_mul', 'other'):
        assert got[key] == pytest.approx(expected.get(key, 0)), key


@pytest.mark.parametrize('hw', [(8, 8), (14, 14), (7, 12)])
@pytest.mark.parametrize('num_heads', [None, 4])
def test_circulant_attention_circular(hw, num_heads):
    b, c = 2, 16
    h, w = hw
    n, fw = h * w, w // 2 + 1  # tokens; rfft2 spectrum is h x fw
    heads = c if num_heads is None else num_heads
    attn = CirculantAttention(c, num_heads=num_heads).eval()
    fc = flop_counter(attn, torch.randn(b, n, c), hw_shape=hw)
    linears = b * n * c * c + b * n * c * c  # gate + proj
    qkv = b * (3 * c) * c * (2 * h * fw)  # real W on real and imaginary parts
    fft = (
        b * c * rfft(n)  # rfft2(x)
        + b * heads * rfft(n)  # irfft2(conj(Q) K) -> a
        + b * heads * rfft(n)  # rfft2(p)
        + b * c * rfft(n)
    )  # irfft2(conj(P) V) -> o
    cmul = 4 * b * c * h * fw * 2  # conj(Q) K and conj(P) V
    softmax = b * heads * n
    assert_groups(
        fc.by_operator(), dict(products=linears + qkv, fft=fft, complex_mul=cmul, softmax=softmax)
    )
    assert fc.total() == pytest.approx(linears + qkv + fft + cmul + softmax)
    assert fc.unsupported_ops() == {}
    # the FFT share is real
    assert fc.by_operator()['fft'] / fc.total() > 0.05


def test_circulant_attention_zero_boundary():
    """Zero boundary: FFTs on the padded 5-smooth grid (2H-1, 2W-1 rounded up).
    The module transforms x zero-padded to the grid (rfft2(x, s=grid)),
    projects that spectrum (Ph x Fw) with W_qkv, and crops the inverse of the
    output (a column transform on the grid, then rows of length Pw)."""
    b, c, h, w = 1, 8, 7, 5
    ph, pw = 15, 9  # next 5-smooth >= 13, >= 9
    fw = pw // 2 + 1
    attn = CirculantAttention(c, boundary='zero').eval()
    fc = flop_counter(attn, torch.randn(b, h * w, c), hw_shape=(h, w))
    fft = (
        b * c * rfft(ph * pw)  # rfft2(x, s=grid)
        + b * c * rfft(ph * pw)  # irfft2 -> a on the grid
        + b * c * rfft(ph * pw)  # rfft2(p)
        + b * c * fw * cfft(ph)
        + b * c * h * rfft(pw)
    )  # cropped inverse
    assert_groups(
        fc.by_operator(),
        dict(
            products=2 * b * h * w * c * c  # gate, proj
            + b * 3 * c * c * 2 * ph * fw,  # qkv on the padded spectrum
            fft=fft,
            softmax=b * c * ph * pw,
            complex_mul=2 * 4 * b * c * ph * fw,
        ),
    )


# ------------------------------------------------------ core attention module
def core_expected(b, n, c, heads, k, fold):
    """Analytic MACs of CoreAttention with C' = k cores (see ops/core.py)."""
    cores_side = 4 * b * k * c * c  # q_core, core_proj, k_core, v_core
    softmax = b * heads * k * n + b * heads * n * k  # gather + broadcast
    if not fold:
        return dict(
            products=cores_side
            + 4 * b * n * c * c  # k/v/q_patch + proj on the patches
            + 2 * b * k * n * c  # gather: scores + weighted sum
            + 2 * b * n * k * c,  # broadcast: scores + weighted sum
            softmax=softmax,
        )
    # folded: per head, the patch-side weights move onto the cores:
    # q W_k,h, W_v,h out, W_q,h^T k, v W_o,h (4 k c^2) and b_q . k (k c);
    # gather and broadcast then run on raw C-wide patches for every head
    return dict(
        products=cores_side
        + 4 * b * k * c * c
        + b * k * c
        + 2 * b * heads * k * n * c  # gather vs raw patches
        + 2 * b * n * heads * k * c,  # broadcast vs raw patches
        softmax=softmax,
    )


@pytest.mark.parametrize('fold', [False, True])
@pytest.mark.parametrize('k', [1, 4, 16])
def test_core_attention(fold, k):
    b, n, c, heads = 2, 50, 32, 4
    attn = CoreAttention(c, heads, fold_projections=fold).eval()
    fc = flop_counter(attn, (torch.randn(b, n, c), torch.randn(b, k, c)))
    exp = core_expected(b, n, c, heads, k, fold)
    assert_groups(fc.by_operator(), exp)
    assert fc.total() == sum(exp.values())


def test_core_attention_scales_with_cores():
    """With folded projections every patch-side term is proportional to C'."""
    b, n, c, heads = 1, 400, 64, 2
    attn = CoreAttention(c, heads, fold_projections=True).eval()
    x = torch.randn(b, n, c)
    f = {k: count_flops(attn, (x, torch.randn(b, k, c))) for k in (8, 16, 64)}
    assert f[16] - f[8] == pytest.approx((f[64] - f[16]) / 6)
    assert f[64] / f[8] > 7  # nearly linear in C', no hidden O(N C^2) term


def test_chunked_core_attention_counts_the_same():
    b, n, c, heads, k = 1, 96, 16, 2, 4
    x, cores = torch.randn(b, n, c), torch.randn(b, k, c)
    for fold in (False, True):
        whole = CoreAttention(c, heads, fold_projections=fold).eval()
        chunked = CoreAttention(c, heads, fold_projections=fold, chunk_size=32).eval()
        chunked.load_state_dict(whole.state_dict())
        by_whole = grouped(flop_counter(whole, (x, cores)).by_operator())
        by_chunk = grouped(flop_counter(chunked, (x, cores)).by_operator())
        # chunking adds only the running-max rescale exp(m - m_new) of the
        # (b, heads, C') state for each of the 2 further chunks
        by_whole['softmax'] += 2 * b * heads * k
        assert by_chunk == pytest.approx(by_whole)
        assert by_whole == pytest.approx(
            core_expected(b, n, c, heads, k, fold)
            | dict(fft=0, complex_mul=0, other=0, softmax=by_whole['softmax'])
        )


# ------------------------------------------------------------------ misc
class SelfAttn(nn.Module):
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x)[0]


def test_multihead_attention_fast_path_and_unfused():
    """nn.MultiheadAttention: the fused inference op (CPU, eval) and the
    unfused path (meta tensors) both give 4 projections + 2 products +
    softmax."""
    b, n, e, heads = 2, 30, 16, 4
    expected = 4 * b * n * e * e + 2 * b * n * n * e + b * heads * n * n
    mha = nn.MultiheadAttention(e, heads, batch_first=True).eval()
    assert count_flops(SelfAttn(mha), torch.randn(b, n, e)) == expected
    with torch.device('meta'):
        mha = nn.MultiheadAttention(e, heads, batch_first=True).eval()
        x = torch.randn(b, n, e)
    assert count_flops(SelfAttn(mha), x) == expected


@pytest.mark.parametrize('boundary', ['circular', 'zero'])
def test_meta_device_counts_like_cpu(boundary):
    """Shape-only tracing on meta tensors (no compute) gives the CPU count."""
    hw, c = (6, 10), 8
    attn = CirculantAttention(c, boundary=boundary).eval()
    cpu = count_flops(attn, torch.randn(1, 60, c), hw_shape=hw)
    with torch.device('meta'):
        attn = CirculantAttention(c, boundary=boundary).eval()
        x = torch.randn(1, 60, c)
    assert count_flops(attn, x, hw_shape=hw) == pytest.approx(cpu)
    assert cpu > 0


class TinyNet(nn.Module):
    def __init__(self, c=8, hw=(4, 6)):
        super().__init__()
        self.hw = hw
        self.embed = nn.Conv2d(3, c, 1)
        self.attn = CirculantAttention(c)
        self.head = nn.Linear(c, 5)

    def forward(self, img):
        x = self.embed(img).flatten(2).transpose(1, 2)
        return self.head(self.attn(x, self.hw))


def test_get_complexity():
    from mmcirc.analysis import attention_modules, get_complexity

    net = TinyNet().eval()
    res = get_complexity(net, (3, 4, 6))
    n, c = 24, 8
    assert attention_modules(net) == ['attn']
    assert res['params'] == sum(p.numel() for p in net.parameters())
    assert res['by_module']['embed'] == n * 3 * c
    assert res['by_module']['head'] == n * c * 5
    assert res['attention_flops'] == res['by_module']['attn'] > 0
    assert res['flops'] == pytest.approx(n * 3 * c + n * c * 5 + res['attention_flops'])


def test_an_operator_declaring_itself_is_attention_with_its_own_handles():
    """``attention_kind`` makes a module an attention module; its ``flop_handles`` price
    an op mmengine does not (logsumexp: one per input element, as declared)."""
    from collections import Counter

    from mmcirc.analysis import attention_modules, get_complexity

    def one_per_element(inputs, outputs):
        return Counter({'logsumexp': math.prod(inputs[0].type().sizes())})

    class LSE(nn.Module):
        attention_kind = 'lse'
        flop_handles = {'aten::logsumexp': one_per_element}

        def forward(self, x):
            return x - torch.logsumexp(x, -1, keepdim=True)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.lse = nn.Linear(6, 5), LSE()

        def forward(self, x):
            return self.lse(self.proj(x))

    net = Net().eval()
    res = get_complexity(net, inputs=torch.randn(2, 3, 6))
    assert attention_modules(net) == ['lse']
    assert res['by_module']['lse'] == res['attention_flops'] == 2 * 3 * 5
    assert res['flops'] == 2 * 3 * 6 * 5 + 2 * 3 * 5


def test_get_flops_tool(tmp_path):
    """tools/analysis/get_flops.py on a bare CA-PVT backbone config: one row per
    stage, circulant stages carry FFT work, totals add up."""
    import json

    from helpers import run_tool

    cfg = tmp_path / 'capvt.py'
    cfg.write_text(
        "default_scope = 'mmdet'\n"
        "custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)\n"
        "model = dict(type='CAPVT', arch=dict(embed_dims=[16, 32, 40, 64], "
        'depths=[1, 1, 1, 1], num_heads=[1, 2, 5, 8]))\n'
    )
    out = tmp_path / 'flops.json'
    proc = run_tool(
        ['tools/analysis/get_flops.py', str(cfg), '--shape', '64', '96', '--out-json', str(out)],
        cwd=tmp_path,
        timeout=300,
    )
    assert '| stage 1 | circulant |' in proc.stdout
    res = json.loads(out.read_text())
    assert res['shape'] == [64, 96] and res['mode'] == 'full'
    stages = [r for r in res['rows'] if r['part'].startswith('stage')]
    assert [r['attention'] for r in stages] == ['circulant', 'circulant', 'sra', 'sra']
    assert sum(r['flops'] for r in res['rows']) == pytest.approx(res['flops'])
    assert res['by_operator']['fft'] > 0 and res['by_operator']['complex_mul'] > 0
    assert 0 < res['attn_flops'] < res['flops']


def test_backbone_difference_is_the_attention_alone():
    """CA-PVT (stages 1-2 circulant) against its all-SRA twin, same weights shapes
    elsewhere: the whole-backbone counts differ by exactly what the attention
    predicts: per circulant block the analytic CirculantAttention (above) plus its
    depthwise 3x3 CPE, minus the SRA module the twin counts in that place. A
    counter that lost an op inside the traced backbone (the FFTs, say) fails."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules

    register_all_modules(init_default_scope=False)
    arch = dict(embed_dims=[16, 32, 40, 64], depths=[1, 2, 1, 1], num_heads=[1, 2, 5, 8])
    ca = MODELS.build(dict(type='CAPVT', arch=arch)).eval()
    twin = MODELS.build(dict(type='CAPVT', arch=arch, stage_attentions='sra')).eval()
    img = torch.randn(1, 3, 64, 96)
    fc_ca, fc_twin = flop_counter(ca, (img,)), flop_counter(twin, (img,))
    sra = fc_twin.by_module()
    expected = 0.0
    for stage, (h, w), c in ((0, (16, 24), 16), (1, (8, 12), 32)):
        n, fw = h * w, w // 2 + 1
        circulant = (
            2 * n * c * c  # gate + proj
            + 3 * c * c * 2 * h * fw  # qkv on the spectrum
            + 4 * c * rfft(n)  # rfft2 x, irfft2 a, rfft2 p, irfft2 o (d = 1)
            + 2 * 4 * c * h * fw  # conj(Q) K, conj(P) V
            + c * n
        )  # softmax
        cpe = 9 * n * c  # depthwise 3x3 (bias not counted, as mmengine's convs)
        for blk in range(arch['depths'][stage]):
            expected += circulant + cpe - sra[f'layers.{stage}.blocks.{blk}.attn']
    assert fc_ca.total() - fc_twin.total() == pytest.approx(expected, rel=1e-9)
    assert fc_ca.by_operator()['fft'] > 0
