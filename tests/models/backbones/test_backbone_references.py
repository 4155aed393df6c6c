"""Whole-backbone references.

* boundary='zero': the FFT pyramid equals the same pyramid with every circulant
  layer replaced by the dense O(N^2) reference of tests/ops/dense_reference.py.
* original attention everywhere: equals mmdet's own PyramidVisionTransformer /
  SwinTransformer with the same weights (key mapping of the docstrings).
"""

import pytest
import torch

from mmcirc.models.backbones import CAPVT, CASwin
from mmcirc.models.convert.pvt import convert_mmdet_pvt_keys
from mmcirc.ops.circulant import CirculantAttention
from ops import dense_reference


TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 2, 1), num_heads=(1, 2, 3, 4))


def sharpen(model):
    """Larger q/k/v weights than the std-0.02 init, so that the softmax over offsets
    is far from uniform and the boundary handling really matters."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, CirculantAttention):
                m.qkv.weight.normal_(0, 2 / m.dim**0.5)
    return model


def dense_forward(self, x, hw_shape):
    return self.proj_drop(dense_reference.circulant_module_dense(self, x, hw_shape))


@pytest.mark.parametrize('heads', [None, 2], ids=['d1', 'heads2'])
@pytest.mark.parametrize('size', [(40, 56), (37, 23)], ids=['40x56', '37x23'])
@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_zero_boundary_backbone_matches_dense_reference(cls, size, heads, monkeypatch):
    torch.manual_seed(0)
    model = cls(
        arch=TINY,
        stage_attentions=('circulant', 'circulant', 'circulant', 'core'),
        boundary='zero',
        circulant_heads=heads,
        num_cores_max=4,
    )
    model.init_weights()
    model = sharpen(model).double().eval()
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    with torch.no_grad():
        fft_outs = model(x)
        monkeypatch.setattr(CirculantAttention, 'forward', dense_forward)
        dense_outs = model(x)
    for a, b in zip(fft_outs, dense_outs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_zero_and_circular_boundary_differ():
    torch.manual_seed(0)
    zero = CAPVT(arch=TINY, stage_attentions='circulant', boundary='zero')
    zero.init_weights()
    sharpen(zero)
    circ = CAPVT(arch=TINY, stage_attentions='circulant', boundary='circular')
    circ.load_state_dict(zero.state_dict())
    x = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        assert not torch.allclose(zero.eval()(x)[0], circ.eval()(x)[0], atol=1e-4)


def test_all_sra_capvt_equals_mmdet_pvt():
    from mmdet.models.backbones import PyramidVisionTransformer

    torch.manual_seed(0)
    ref = PyramidVisionTransformer(
        pretrain_img_size=224,
        embed_dims=8,
        num_layers=[1, 2, 1, 1],
        num_heads=[1, 2, 3, 4],
        drop_path_rate=0.0,
    )
    ref.init_weights()
    ref.eval()
    ours = CAPVT(
        arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 2, 1, 1), num_heads=(1, 2, 3, 4)),
        stage_attentions='sra',
        drop_path_rate=0.0,
    ).eval()
    ours.load_state_dict(convert_mmdet_pvt_keys(ref.state_dict()), strict=True)
    # float64: the same math must agree to rounding on every CPU (in float32 the two
    # summation orders differ by ~1e-6 on an AVX2 host)
    ref, ours = ref.double(), ours.double()
    x = torch.randn(2, 3, 64, 96, dtype=torch.float64)  # a multiple of 32: mmdet's PVT does not pad
    with torch.no_grad():
        for a, b in zip(ref(x), ours(x)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_all_window_caswin_equals_mmdet_swin():
    from mmdet.models.backbones import SwinTransformer

    torch.manual_seed(0)
    ref = SwinTransformer(
        embed_dims=8, depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8), window_size=7, drop_path_rate=0.0
    )
    ref.init_weights()
    ref.eval()
    ours = CASwin(
        arch=dict(embed_dims=8, depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8)),
        stage_attentions='window',
        drop_path_rate=0.0,
    ).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)  # identical key names
    x = torch.randn(2, 3, 75, 113)  # not a multiple of 32: both pad the same way
    with torch.no_grad():
        for a, b in zip(ref(x), ours(x)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_ca_layout_shares_mmdet_keys_of_kept_parts():
    """Everything but the attention of replaced stages maps 1:1 onto mmdet's keys."""
    from mmdet.models.backbones import PyramidVisionTransformer, SwinTransformer

    pvt_ref = set(
        convert_mmdet_pvt_keys(
            PyramidVisionTransformer(
                embed_dims=8, num_layers=[1, 1, 2, 1], num_heads=[1, 2, 3, 4]
            ).state_dict()
        )
    )
    pvt = set(CAPVT(arch=TINY).state_dict())
    swin_ref = set(
        SwinTransformer(embed_dims=8, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8)).state_dict()
    )
    swin = set(
        CASwin(arch=dict(embed_dims=8, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8))).state_dict()
    )
    for ours, ref, stages in ((pvt, pvt_ref, 'layers'), (swin, swin_ref, 'stages')):
        replaced = (f'{stages}.0.blocks.', f'{stages}.1.blocks.')
        kept_ref = {k for k in ref if not k.startswith(replaced)}
        kept_ours = {k for k in ours if not k.startswith(replaced)}
        assert kept_ref == kept_ours
        # in the replaced stages, the norms and MLPs keep mmdet's names too
        for k in ref - kept_ref:
            if '.norm1.' in k or '.norm2.' in k or '.ffn.' in k:
                assert k in ours, k
