"""mmcirc.analysis.attention_maps: the BCCB projection against a brute-force average
over explicit offset classes, its projection properties, and hooks that capture exactly
the matrices (kernels, gather weights) the layers use."""

import itertools
import math

import pytest
import torch
from ops.dense_reference import circulant_attention_dense, offset_index

from mmcirc.analysis.attention_maps import (
    AttentionCapture,
    bccb_distance,
    bccb_expand,
    bccb_kernel,
    bccb_project,
    centre_kernel,
    find_attention_layers,
    gather_entropy,
    shuffle_tokens,
)
from mmcirc.ops import CirculantAttention, CoreAttention


pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _random_attention(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(*shape, generator=g, dtype=torch.float64) * 2, dim=-1)


def _brute_projection(attn, q_grid, k_grid):
    """P(A) by the definition, with Python ints: group the pairs (i, j) by the wrapped
    offset of key j from the key cell that covers query i, average each group."""
    (hq, wq), (hk, wk) = q_grid, k_grid
    groups = {}
    for (r, c), (kr, kc) in itertools.product(
        itertools.product(range(hq), range(wq)), itertools.product(range(hk), range(wk))
    ):
        cr, cc = math.floor(r * hk / hq), math.floor(c * wk / wq)
        m = ((kr - cr) % hk, (kc - cc) % wk)
        groups.setdefault(m, []).append((r * wq + c, kr * wk + kc))
    out = torch.empty_like(attn)
    for pairs in groups.values():
        i, j = torch.tensor(pairs).T
        out[..., i, j] = attn[..., i, j].mean(-1, keepdim=True)
    return out


def _bccb_from_kernel(kernel):
    """BCCB matrix M[i, j] = kernel[(rj - ri) mod H, (cj - ci) mod W], by loops."""
    h, w = kernel.shape
    m = torch.empty(h * w, h * w, dtype=kernel.dtype)
    for ri, ci, rj, cj in itertools.product(range(h), range(w), range(h), range(w)):
        m[ri * w + ci, rj * w + cj] = kernel[(rj - ri) % h, (cj - ci) % w]
    return m


# --------------------------------------------------------------------------- projection
def test_bccb_matrix_is_its_own_projection():
    kernel = torch.rand(3, 5, dtype=torch.float64)
    m = _bccb_from_kernel(kernel)
    torch.testing.assert_close(bccb_project(m, (3, 5)), m)
    torch.testing.assert_close(bccb_kernel(m, (3, 5)), kernel)
    assert bccb_distance(m, (3, 5)).item() < 1e-7


@pytest.mark.parametrize('q_grid,k_grid', [((3, 4), (3, 4)), ((6, 4), (3, 2)), ((5, 7), (2, 3))])
def test_projection_matches_brute_force_class_average(q_grid, k_grid):
    attn = _random_attention(2, q_grid[0] * q_grid[1], k_grid[0] * k_grid[1])
    torch.testing.assert_close(
        bccb_project(attn, q_grid, k_grid), _brute_projection(attn, q_grid, k_grid)
    )


@pytest.mark.parametrize('q_grid,k_grid', [((4, 5), None), ((6, 4), (3, 2))])
def test_projection_is_idempotent(q_grid, k_grid):
    kg = k_grid or q_grid
    attn = _random_attention(3, q_grid[0] * q_grid[1], kg[0] * kg[1], seed=1)
    once = bccb_project(attn, q_grid, k_grid)
    torch.testing.assert_close(bccb_project(once, q_grid, k_grid), once)


@pytest.mark.parametrize('q_grid,k_grid', [((4, 5), None), ((6, 4), (3, 2))])
def test_projection_is_frobenius_orthogonal(q_grid, k_grid):
    kg = k_grid or q_grid
    attn = _random_attention(3, q_grid[0] * q_grid[1], kg[0] * kg[1], seed=2)
    proj = bccb_project(attn, q_grid, k_grid)
    inner = ((attn - proj) * proj).sum((-2, -1))
    assert inner.abs().max().item() < 1e-12
    # and so P(A) is the nearest: any other offset-only matrix is farther
    other = bccb_expand(bccb_kernel(attn, q_grid, k_grid) + 0.01, q_grid)
    assert ((attn - other).norm(dim=(-2, -1)) > (attn - proj).norm(dim=(-2, -1))).all()


def test_distance_equals_direct_frobenius_ratio():
    attn = _random_attention(2, 3, 20, 20, seed=3)
    direct = (attn - bccb_project(attn, (4, 5))).norm(dim=(-2, -1)) / attn.norm(dim=(-2, -1))
    torch.testing.assert_close(bccb_distance(attn, (4, 5)), direct)
    assert direct.min().item() > 0.1  # a random softmax matrix is far from BCCB
    pooled = (attn - bccb_project(attn, (4, 5))).square().sum((0, -2, -1)) / attn.square().sum(
        (0, -2, -1)
    )
    torch.testing.assert_close(bccb_distance(attn, (4, 5), reduce_dims=(0,)), pooled.sqrt())


def test_reduced_key_grid_kernel_equals_query_pooled_kernel():
    """With Hq = s*Hk (SRA) the kernel is that of the matrix whose query rows are
    averaged over each s x s cell (the comparison on the reduced grid)."""
    attn = _random_attention(24, 6, seed=4)  # queries 6x4, keys 3x2, s = 2
    pooled = attn.view(3, 2, 2, 2, 6).mean((1, 3)).reshape(6, 6)  # (Hk, s, Wk, s) cells
    torch.testing.assert_close(bccb_kernel(attn, (6, 4), (3, 2)), bccb_kernel(pooled, (3, 2)))


@pytest.mark.parametrize('hw', [(4, 5), (3, 3)])
def test_circulant_attentions_own_matrix_is_bccb(hw):
    """A from the dense reference (v = one-hot tokens, so A v = A) is at distance 0,
    and its kernel is a probability map over the offsets."""
    h, w = hw
    n = h * w
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, h, w, n, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.eye(n, dtype=torch.float64).view(1, h, w, n)
    attn = circulant_attention_dense(q, k, v, num_heads=1).view(n, n)  # rows: A[i, :]
    assert bccb_distance(attn, hw).item() < 1e-7
    torch.testing.assert_close(bccb_kernel(attn, hw).sum(), torch.tensor(1.0, dtype=torch.float64))
    zero = circulant_attention_dense(q, k, v, boundary='zero', num_heads=1).view(n, n)
    assert bccb_distance(zero, hw).item() > 1e-3  # no wrap-around: not circulant


def test_shuffled_tokens_keep_entries_and_break_bccb():
    m = _bccb_from_kernel(
        torch.softmax(torch.randn(4, 4, dtype=torch.float64).flatten(), 0).view(4, 4)
    )
    s = shuffle_tokens(m, torch.Generator().manual_seed(0))
    torch.testing.assert_close(s.flatten().sort().values, m.flatten().sort().values)
    torch.testing.assert_close(s.sum(-1).sort().values, m.sum(-1).sort().values)
    assert bccb_distance(s, (4, 4)).item() > 0.1


def test_bad_grid_is_a_value_error():
    with pytest.raises(ValueError, match='attn must end in'):
        bccb_kernel(torch.rand(6, 6), (2, 2))
    with pytest.raises(ValueError, match='q_grid'):
        bccb_kernel(torch.rand(6, 6), (2, 0))


def test_centre_kernel_puts_offset_zero_in_the_middle():
    k = torch.zeros(5, 4)
    k[0, 0] = 1
    assert centre_kernel(k).nonzero().tolist() == [[2, 2]]


def test_gather_entropy_uniform_and_one_hot():
    w = torch.tensor([[0.25] * 4, [1.0, 0, 0, 0]])
    torch.testing.assert_close(
        gather_entropy(w), torch.tensor([math.log(4), 0.0], dtype=torch.float64)
    )


# --------------------------------------------------------------------------- mmcirc ops
@pytest.mark.parametrize('boundary,heads', [('circular', None), ('circular', 2), ('zero', 2)])
def test_circulant_capture_is_the_kernel_the_layer_uses(boundary, heads):
    """out == proj((A v) * gate) with A[i, j] = p[j - i] built from the captured kernel
    with the dense reference's explicit offsets (rows renormalised for 'zero')."""
    torch.manual_seed(0)
    b, h, w, c = 2, 4, 5, 8
    mod = CirculantAttention(c, num_heads=heads, boundary=boundary).double().eval()
    x = torch.randn(b, h * w, c, dtype=torch.float64)
    with AttentionCapture(mod) as cap:
        out = mod(x, (h, w))
    (rec,) = cap.records
    assert rec.kind == 'circulant' and rec.q_grid == (h, w)
    nh = c if heads is None else heads
    p = rec.weights  # (B, heads, H, W) or (B, heads, 2H-1, 2W-1)
    idx, n_off = offset_index(h, w, boundary)
    attn = p.flatten(2)[..., idx]  # (B, heads, N, N)
    if boundary == 'zero':
        attn = attn / attn.sum(-1, keepdim=True)
    v = (x @ mod.qkv.weight.T).chunk(3, -1)[2]  # (B, N, C)
    vh = v.view(b, h * w, nh, c // nh).transpose(1, 2)
    o = (attn @ vh).transpose(1, 2).reshape(b, h * w, c)
    gate = torch.nn.functional.silu(mod.gate[0](x))
    torch.testing.assert_close(out, mod.proj(o * gate))
    assert p.shape[-2] * p.shape[-1] == n_off


def test_core_capture_is_the_gather_the_layer_uses():
    """Rows of the gather weights sum to 1 over the patches, and
    new_cores == cores + core_proj(concat_h(P_h v_h))."""
    torch.manual_seed(0)
    b, n, c, heads, ncores = 2, 30, 16, 4, 5
    mod = CoreAttention(c, heads).double().eval()
    x = torch.randn(b, n, c, dtype=torch.float64)
    cores = torch.randn(b, ncores, c, dtype=torch.float64)
    with AttentionCapture(mod) as cap:
        _, new_cores = mod(x, cores)
    (rec,) = cap.records
    gather = rec.weights
    assert gather.shape == (b, heads, ncores, n)
    torch.testing.assert_close(gather.sum(-1), torch.ones(b, heads, ncores, dtype=torch.float64))
    v = mod.v_patch(x).view(b, n, heads, c // heads).transpose(1, 2)
    g = (gather @ v).transpose(1, 2).reshape(b, ncores, c)
    torch.testing.assert_close(new_cores, cores + mod.core_proj(g))


def test_find_attention_layers_filters_kinds():
    model = torch.nn.ModuleDict(dict(a=CirculantAttention(4), b=CoreAttention(4, 2)))
    assert [(n, k) for n, k, _ in find_attention_layers(model)] == [
        ('a', 'circulant'),
        ('b', 'core'),
    ]
    assert [n for n, _, _ in find_attention_layers(model, ('core',))] == ['b']
    with pytest.raises(ValueError, match='kinds'):
        find_attention_layers(model, ('dense',))


class _DotAttention(torch.nn.Module):
    """An operator that declares its attention itself: y = softmax(x x^T) x."""

    attention_kind = 'dot'
    attention_form = 'matrix'

    def forward(self, x, hw_shape):
        return torch.softmax(x @ x.transpose(1, 2), -1) @ x

    def attention_weights(self, args, kwargs, ctx):
        x, hw = args[0], tuple(args[1])
        return dict(weights=torch.softmax(x @ x.transpose(1, 2), -1)[:, None], q_grid=hw)


def test_an_operator_declaring_itself_is_captured_and_filtered_by_form():
    """No probe and no registration: the class attributes suffice. A missing k_grid is
    the enclosing block's hw_shape; the captured A reproduces the output."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.circ = _DotAttention(), CirculantAttention(4)

        def forward(self, x, hw_shape):
            return self.circ(self.attn(x, hw_shape), hw_shape)

    model = torch.nn.ModuleDict(dict(blk=Block()))
    assert [(n, k) for n, k, _ in find_attention_layers(model, forms=('matrix',))] == [
        ('blk.attn', 'dot')
    ]
    assert [n for n, _, _ in find_attention_layers(model, forms=('kernel',))] == ['blk.circ']
    assert [n for n, _, _ in find_attention_layers(model, kinds=('dot',))] == ['blk.attn']
    with pytest.raises(ValueError, match='forms must be a subset of'):
        find_attention_layers(model, forms=('dense',))
    x = torch.randn(2, 6, 4)
    seen = []
    model.blk.attn.register_forward_hook(lambda m, a, o: seen.append(o))
    with AttentionCapture(model, forms=('matrix',)) as cap, torch.no_grad():
        model.blk(x, (2, 3))
    (rec,) = cap.records
    assert (rec.kind, rec.form, rec.q_grid, rec.k_grid) == ('dot', 'matrix', (2, 3), (2, 3))
    torch.testing.assert_close(seen[0], rec.weights[:, 0] @ x)


# --------------------------------------------------------------------------- mmdet layers
def _mha_output(attn, v, heads):
    """concat_h(A_h V_h): attn (B, h, Nq, Nk), v (B, Nk, C) -> (B, Nq, C)."""
    b, nk, c = v.shape
    vh = v.view(b, nk, heads, c // heads).transpose(1, 2)
    return (attn @ vh).transpose(1, 2).reshape(b, attn.shape[2], c)


def test_pvt_sra_capture_is_the_matrix_the_layer_uses():
    """A manual forward of one mmdet PVT layer (sr_ratio 2, 2 heads) with the captured A:
    x + out_proj(A V) == the layer's attention output, and the head mean equals the
    weights torch's nn.MultiheadAttention returns itself."""
    from mmdet.models.backbones.pvt import PVTEncoderLayer

    torch.manual_seed(0)
    layer = PVTEncoderLayer(embed_dims=16, num_heads=2, feedforward_channels=32, sr_ratio=2).eval()
    sra = layer.attn
    x = torch.randn(2, 6 * 8, 16)
    returned = []
    handle = sra.attn.register_forward_hook(lambda m, a, o: returned.append(o[1]))
    with AttentionCapture(layer) as cap, torch.no_grad():
        xn = layer.norm1(x)
        out = sra(xn, (6, 8), identity=x)
    handle.remove()
    (rec,) = cap.records
    assert rec.kind == 'sra' and rec.q_grid == (6, 8) and rec.k_grid == (3, 4)
    attn = rec.weights  # (B, 2, 48, 12)
    mha = sra.attn
    kv = sra.norm(sra.sr(xn.transpose(1, 2).reshape(2, 16, 6, 8)).flatten(2).transpose(1, 2))
    v = kv @ mha.in_proj_weight[32:].T + mha.in_proj_bias[32:]
    expected = x + mha.out_proj(_mha_output(attn, v, 2))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returned[0], attn.mean(1), rtol=1e-5, atol=1e-6)


def test_swin_window_capture_is_the_matrix_the_block_uses():
    """Shifted-window block (relative position bias + shift mask): the window attention
    output equals proj(A V) with the captured A, window by window."""
    from mmdet.models.backbones.swin import SwinBlock

    torch.manual_seed(0)
    block = SwinBlock(
        embed_dims=16, num_heads=2, feedforward_channels=32, window_size=3, shift=True
    ).eval()
    wmsa = block.attn.w_msa
    torch.nn.init.normal_(wmsa.relative_position_bias_table, std=0.5)
    seen = []
    handle = wmsa.register_forward_hook(lambda m, a, o: seen.append((a[0], o)))
    with AttentionCapture(block) as cap, torch.no_grad():
        block(torch.randn(1, 6 * 9, 16), (6, 9))
    handle.remove()
    (rec,) = cap.records
    ((windows, out),) = seen
    assert rec.kind == 'window' and rec.q_grid == rec.k_grid == (3, 3)
    attn = rec.weights  # (6 windows, 2, 9, 9)
    assert attn.shape == (6, 2, 9, 9)
    v = windows @ wmsa.qkv.weight[32:].T + wmsa.qkv.bias[32:]
    torch.testing.assert_close(out, wmsa.proj(_mha_output(attn, v, 2)), rtol=1e-5, atol=1e-5)
    # the shift mask reached the capture: some pairs of a border window are cut off
    assert (attn < 1e-20).any()


# --------------------------------------------------------------------------- ViT layers
def test_mmpretrain_vit_capture_is_the_matrix_the_layer_uses():
    """mmpretrain ViT without class token: the attention output equals proj(A V); the
    grid is the patch embedding's output."""
    from mmpretrain.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(
        arch=dict(embed_dims=16, num_layers=1, num_heads=2, feedforward_channels=32),
        img_size=(24, 40),
        patch_size=8,
        with_cls_token=False,
        out_type='avg_featmap',
    )
    vit.eval()
    attn_mod = vit.layers[0].attn
    seen = []
    handle = attn_mod.register_forward_hook(lambda m, a, o: seen.append((a[0], o)))
    with AttentionCapture(vit) as cap, torch.no_grad():
        vit(torch.randn(1, 3, 24, 40))
    handle.remove()
    (rec,) = cap.records
    assert rec.kind == 'vit' and rec.q_grid == rec.k_grid == (3, 5)
    ((x, out),) = seen
    v = x @ attn_mod.qkv.weight[32:].T + attn_mod.qkv.bias[32:]
    torch.testing.assert_close(
        out, attn_mod.proj(_mha_output(rec.weights, v, 2)), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize('class_token', [False, True])
def test_timm_vit_capture_drops_prefix_tokens(class_token):
    import timm.models.vision_transformer as tv

    torch.manual_seed(0)
    vit = tv.VisionTransformer(
        img_size=32,
        patch_size=8,
        embed_dim=16,
        depth=1,
        num_heads=2,
        class_token=class_token,
        global_pool='token' if class_token else 'avg',
        num_classes=0,
    ).eval()
    attn_mod = vit.blocks[0].attn
    seen = []
    handle = attn_mod.register_forward_hook(lambda m, a, o: seen.append((a[0], o)))
    with AttentionCapture(vit) as cap, torch.no_grad():
        vit(torch.randn(1, 3, 32, 32))
    handle.remove()
    (rec,) = cap.records
    assert rec.kind == 'vit' and rec.q_grid == (4, 4) and rec.weights.shape == (1, 2, 16, 16)
    if not class_token:
        ((x, out),) = seen
        v = x @ attn_mod.qkv.weight[32:].T + attn_mod.qkv.bias[32:]
        torch.testing.assert_close(
            out, attn_mod.proj(_mha_output(rec.weights, v, 2)), rtol=1e-5, atol=1e-5
        )
    else:  # the patch block of a row no longer sums to 1: the class token took a share
        assert (rec.weights.sum(-1) < 1 - 1e-6).all()
