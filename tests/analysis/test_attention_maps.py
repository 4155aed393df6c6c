"""mmcirc.analysis.attention_maps: hooks that capture exactly the matrices (kernels,
gather weights) the layers use, whatever declares them (the BCCB math is
tests/analysis/test_bccb.py's)."""

import pytest
import torch
from ops.dense_reference import offset_index

from mmcirc.analysis.attention_maps import AttentionCapture, find_attention_layers
from mmcirc.ops import CirculantAttention, CoreAttention

pytestmark = pytest.mark.usefixtures('one_torch_thread')


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
