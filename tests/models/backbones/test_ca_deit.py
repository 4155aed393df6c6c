"""CADeiT: equality with the official CA-DeiT code, shapes at any size, the mm contract.

The reference numbers come from the official model (github.com/LeapLabTHU/
Circulant-Attention, ``models/ca_deit.py``) run outside this repository on a small
random-weight model (depth 2, width 48, patch 8, input 2 x 3 x 64 x 64: the official
code takes square maps only). Regenerate ``tests/fixtures/official/ca_deit_official.pth``
with::

    PYTHONPATH=<dir with timm> python tests/fixtures/make_official_fixtures.py \\
        --ca-repo <clone of LeapLabTHU/Circulant-Attention> --out tests/fixtures/official
"""

import os.path as osp

import pytest
import torch

from helpers import REPO
from mmcirc.models.backbones import CADeiT
from mmcirc.models.convert.deit import convert_cadeit_official

FIXTURE = osp.join(REPO, 'tests', 'fixtures', 'official', 'ca_deit_official.pth')


def _fixture():
    return torch.load(FIXTURE, weights_only=True)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _loaded(fix, **kwargs):
    result, _ = convert_cadeit_official(fix['checkpoint'])
    model = CADeiT(arch=fix['arch'], patch_size=fix['patch_size'], **kwargs).eval()
    backbone = {
        k[len('backbone.') :]: v for k, v in result.state_dict.items() if k.startswith('backbone.')
    }
    model.load_state_dict(backbone, strict=True)
    head = {
        k[len('head.fc.') :]: v for k, v in result.state_dict.items() if k.startswith('head.fc.')
    }
    return model, head


def test_logits_equal_official():
    fix = _fixture()
    model, head = _loaded(fix, out_type='avg_featmap')
    with torch.no_grad():
        feat = model(fix['input'])[-1]  # (B, C) mean of the normed tokens
    logits = torch.nn.functional.linear(feat, head['weight'], head['bias'])
    assert logits.shape == fix['logits'].shape
    assert _rel(logits, fix['logits']) < 1e-5
    torch.testing.assert_close(
        logits, fix['logits'], rtol=1e-5, atol=1e-5 * float(fix['logits'].abs().max())
    )


@pytest.mark.usefixtures('triton_interpreter')
def test_logits_with_the_triton_kernel_equal_official():
    """``kernel='triton'`` (the attention core in Triton's interpreter) against the
    official code's logits."""
    fix = _fixture()
    model, head = _loaded(fix, out_type='avg_featmap', kernel='triton')
    with torch.no_grad():
        feat = model(fix['input'])[-1]
    logits = torch.nn.functional.linear(feat, head['weight'], head['bias'])
    assert all(b.attn.kernel == 'triton' for b in model.blocks)
    assert _rel(logits, fix['logits']) < 1e-5


def test_featmap_mean_is_the_pooled_feature():
    fix = _fixture()
    model, _ = _loaded(fix, out_type='featmap')
    pooled, _ = _loaded(fix, out_type='avg_featmap')
    with torch.no_grad():
        fmap = model(fix['input'])[-1]  # (B, C, H, W)
        feat = pooled(fix['input'])[-1]
    assert fmap.shape == (2, 48, 8, 8)
    torch.testing.assert_close(fmap.mean((2, 3)), feat, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('size', [(56, 72), (49, 97), (17, 33)])
def test_any_size_shapes(size):
    model = CADeiT(arch=dict(embed_dims=16, depth=3), patch_size=8, out_indices=(0, -1)).eval()
    h, w = -(-size[0] // 8), -(-size[1] // 8)  # padded to the patch size
    with torch.no_grad():
        outs = model(torch.randn(2, 3, *size))
    assert [tuple(o.shape) for o in outs] == [(2, 16, h, w)] * 2
    assert all(torch.isfinite(o).all() for o in outs)


def test_non_square_map_transposes_with_the_image():
    """The operator is symmetric in H and W: an H x W image and its transpose (with
    transposed conv kernels) give transposed feature maps. A model that assumed
    h = w = sqrt(n), or mixed up H and W on a non-square map, would not."""
    torch.manual_seed(0)
    model = CADeiT(arch=dict(embed_dims=8, depth=2), patch_size=4).eval()
    model_t = CADeiT(arch=dict(embed_dims=8, depth=2), patch_size=4).eval()
    model_t.load_state_dict(
        {k: (v.transpose(-1, -2) if v.dim() == 4 else v) for k, v in model.state_dict().items()}
    )
    img = torch.randn(1, 3, 12, 28)  # a 3 x 7 map
    with torch.no_grad():
        a = model(img)[0]  # (1, C, 3, 7)
        b = model_t(img.transpose(2, 3))[0]  # (1, C, 7, 3)
    assert a.shape == (1, 8, 3, 7)
    torch.testing.assert_close(a, b.transpose(2, 3), rtol=1e-5, atol=1e-5)


def test_out_types_and_indices():
    model = CADeiT(
        arch=dict(embed_dims=16, depth=3), patch_size=8, out_indices=(1, 2), out_type='raw'
    ).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 32, 48))
    assert [tuple(o.shape) for o in outs] == [(1, 24, 16)] * 2
    # only the last block's output is normed (final LN): unit-variance tokens
    last = outs[1]
    torch.testing.assert_close(
        last.var(-1, unbiased=False), torch.ones(1, 24), rtol=1e-3, atol=1e-3
    )


def test_with_cp_same_gradients():
    torch.manual_seed(0)
    img = torch.randn(1, 3, 32, 32)
    grads = []
    for cp in (False, True):
        torch.manual_seed(1)
        model = CADeiT(arch=dict(embed_dims=16, depth=2), patch_size=8, with_cp=cp)
        model.init_weights()
        model(img)[0].square().sum().backward()
        grads.append(model.blocks[0].attn.qkv.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_frozen_stages():
    model = CADeiT(arch=dict(embed_dims=16, depth=3), patch_size=8, frozen_stages=2)
    model.train()
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not any(p.requires_grad for b in model.blocks[:2] for p in b.parameters())
    assert all(p.requires_grad for p in model.blocks[2].parameters())
    assert all(p.requires_grad for p in model.norm.parameters())
    assert not model.blocks[1].training and model.blocks[2].training


def test_named_archs_parameter_counts():
    """Official parameter counts with the 1000-class head: 6.1 / 23.8 / 93.6 M."""
    for arch, params in (('tiny', 6.1), ('small', 23.8), ('base', 93.6)):
        with torch.device('meta'):
            model = CADeiT(arch=arch)
        n = sum(p.numel() for p in model.parameters()) + model.embed_dims * 1000 + 1000
        assert round(n / 1e6, 1) == params, arch


def test_registered_in_three_libraries():
    from mmcirc.registry import model_registries

    for registry in model_registries():
        model = registry.build(dict(type='CADeiT', arch=dict(embed_dims=16, depth=1), patch_size=8))
        assert isinstance(model, CADeiT)


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(arch='huge'), "arch must be one of ('tiny', 'small', 'base')"),
        (dict(out_type='cls_token'), 'out_type must be one of'),
        (dict(out_indices=12), 'out_indices must be'),
        (dict(frozen_stages=13), 'frozen_stages must be an int in [-1, 12]'),
        (dict(boundary='reflect'), 'boundary must be one of'),
        (dict(kernel='cuda'), "kernel must be one of ('torch', 'triton')"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError) as err:
        CADeiT(**kwargs)
    assert message in str(err.value) and '\n' not in str(err.value)


@pytest.mark.parametrize(
    'arch,width,official', [('tiny', 192, 1.2), ('small', 384, 4.8), ('base', 768, 18.9)]
)
def test_flops_at_224_match_the_official_table(arch, width, official):
    """CA-DeiT-T/S/B at 224: the official README reports 1.2 / 4.8 / 18.9 GFLOPs (MACs,
    FFTs included); mmcirc's counter (FFT 2.5 n log2 n per complex transform) must land
    there to the published digit."""
    from mmcirc.analysis import count_flops

    model = CADeiT(arch=arch, out_type='avg_featmap').eval()
    gmacs = count_flops(model, torch.randn(1, 3, 224, 224)) / 1e9 + width * 1000 / 1e9  # + head
    assert round(gmacs, 1) == official, gmacs


def test_bf16_autocast_close_to_fp32():
    fix = _fixture()
    model, head = _loaded(fix, out_type='avg_featmap')
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        feat = model(fix['input'])[-1]
    logits = torch.nn.functional.linear(feat.float(), head['weight'], head['bias'])
    assert _rel(logits, fix['logits']) < 3e-2
