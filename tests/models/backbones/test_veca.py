"""VECAViT: equality with the official VECA code, elastic C', outputs, the mm contract.

The reference numbers come from the official model (github.com/alansong1322/VECA,
``veca/model.py``) run outside this repository on a small random-weight model (depth
2, width 48, 2 heads, patch 8, 24 cores in chunks of 8, output projection to 40,
input 2 x 3 x 56 x 72, i.e. a 7 x 9 map) at C' = 8 and 16. Regenerate
``tests/fixtures/official/veca_official.pth`` with::

    PYTHONPATH=<dir with timm> python tests/fixtures/make_official_fixtures.py \\
        --veca-repo <clone of alansong1322/VECA> --out tests/fixtures/official
"""

import math
import os.path as osp

import pytest
import torch

from helpers import REPO
from mmcirc.models.backbones import VECAViT
from mmcirc.models.convert.veca import convert_veca_official

FIXTURE = osp.join(REPO, 'tests', 'fixtures', 'official', 'veca_official.pth')
SMALL = dict(embed_dims=16, num_layers=3, num_heads=2, mlp_ratio=2.0, num_cores=24)


def _loaded(**kwargs):
    fix = torch.load(FIXTURE, weights_only=True)
    result, _ = convert_veca_official(fix['checkpoint'], arch=fix['arch'])
    model = VECAViT(
        arch=fix['arch'], patch_size=fix['patch_size'], out_channels=fix['out_channels'], **kwargs
    ).eval()
    model.load_state_dict(
        {k[len('backbone.') :]: v for k, v in result.state_dict.items()}, strict=True
    )
    return fix, model


def _close(a, b):
    assert a.shape == b.shape
    assert float((a - b).norm() / b.norm()) < 1e-5
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize('num_cores', [8, 16])
def test_equal_official(num_cores):
    fix, model = _loaded(out_type='raw', num_cores=num_cores)
    with torch.no_grad():
        cores, patches = model(fix['input'])[-1]
    assert cores.shape == (2, num_cores, 40)
    _close(cores[:, 0], fix[f'global_{num_cores}'])  # the global token
    _close(patches, fix[f'patches_{num_cores}'])  # dense features (B, N, D)


def test_featmap_and_token_outputs():
    fix, model = _loaded(out_type='featmap_and_token', num_cores=16, out_indices=(0, 1))
    with torch.no_grad():
        (f0, t0), (f1, t1) = model(fix['input'])
    assert f0.shape == (2, 48, 7, 9) and t0.shape == (2, 48)  # block 0: raw width, no final LN
    assert f1.shape == (2, 40, 7, 9)
    _close(t1, fix['global_16'])
    _close(f1.flatten(2).transpose(1, 2), fix['patches_16'])  # row-major map of the patches


def test_out_norm_off_leaves_the_last_block_raw_the_official_output_after_the_final_ln():
    """``out_norm=False``: the last block's raw output, which the final LN and output
    projection turn into the official output (the fixture)."""
    fix, model = _loaded(out_type='raw', num_cores=16, out_norm=False)
    with torch.no_grad():
        cores, patches = model(fix['input'])[-1]
        x = model.output_proj(model.final_norm(torch.cat([cores, patches], dim=1)))
    assert cores.shape == (2, 16, 48)
    _close(x[:, 0], fix['global_16'])
    _close(x[:, 16:], fix['patches_16'])


def test_rope_periods_computed_again_after_to_empty():
    model = VECAViT(arch=SMALL, patch_size=8, num_cores=8)
    want = model.rope.periods.clone()
    model.rope.periods.fill_(float('nan'))
    model.rope.init_non_persistent_buffers()
    assert torch.equal(model.rope.periods, want)


def test_set_num_cores_and_presets():
    fix, model = _loaded(out_type='global_token')
    outs = {}
    for c in (8, 16):
        model.set_num_cores(c)
        with torch.no_grad():
            outs[c] = model(fix['input'])[0]
        _close(outs[c], fix[f'global_{c}'])
    model.set_num_cores('mobile')
    assert model.num_cores == 8


def test_prefix_truncation_uses_only_the_first_cores():
    """With C' = 8 the output does not depend on cores 8.. of the bank."""
    torch.manual_seed(0)
    model = VECAViT(arch=SMALL, patch_size=8, num_cores=8, out_type='raw').eval()
    model.init_weights()
    img = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        a = model(img)[0]
        model.cores[8:].add_(1.0)
        model.core_coords[8:].add_(0.5)
        b = model(img)[0]
        model.set_num_cores(16)
        c = model(img)[0]
    torch.testing.assert_close(a[1], b[1])
    assert not torch.allclose(a[1], c[1])


def test_patches_attend_to_cores_only():
    """Changing one patch leaves every other patch unchanged after one block
    (patches exchange information only through the cores, which this patch changes
    only in the block's output)."""
    torch.manual_seed(0)
    model = VECAViT(arch=dict(SMALL, num_layers=1), patch_size=8, out_type='raw').eval()
    model.init_weights()
    img = torch.randn(1, 3, 24, 24)
    img2 = img.clone()
    img2[..., :8, :8] += 1  # patch 0
    with torch.no_grad():
        _, p1 = model(img)[0]
        _, p2 = model(img2)[0]
    torch.testing.assert_close(p1[:, 1:], p2[:, 1:])
    assert not torch.allclose(p1[:, 0], p2[:, 0])


@pytest.mark.parametrize('size', [(56, 72), (50, 97)])
def test_any_size(size):
    model = VECAViT(arch=SMALL, patch_size=8, out_indices=(0, 1, 2)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    hw = (math.ceil(size[0] / 8), math.ceil(size[1] / 8))
    assert [tuple(o.shape) for o in outs] == [(1, 16, *hw)] * 3


def test_train_mode_augments_coordinates_only_in_training():
    torch.manual_seed(0)
    model = VECAViT(arch=SMALL, patch_size=8, out_type='global_token')
    img = torch.randn(1, 3, 24, 24)
    model.eval()
    with torch.no_grad():
        a, b = model(img)[0], model(img)[0]
    torch.testing.assert_close(a, b)
    model.train()
    with torch.no_grad():
        c = model(img)[0]
    assert not torch.allclose(a, c)


def test_frozen_stages():
    model = VECAViT(arch=SMALL, patch_size=8, frozen_stages=3)
    model.train()
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.rope.training
    model = VECAViT(arch=SMALL, patch_size=8, frozen_stages=1)
    model.train()
    assert not model.cores.requires_grad and not model.blocks[0].fc1.weight.requires_grad
    assert model.blocks[1].fc1.weight.requires_grad and model.pos_linears[0].weight.requires_grad


def test_with_cp_same_gradients():
    img = torch.randn(1, 3, 16, 16)
    grads = []
    for cp in (False, True):
        torch.manual_seed(1)
        model = VECAViT(
            arch=SMALL, patch_size=8, with_cp=cp, rope_shift_coords=None, rope_rescale_coords=None
        )
        model.init_weights()
        model(img)[0].square().sum().backward()
        grads.append(model.blocks[0].attn.q_proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_named_archs():
    for arch, (dims, layers) in dict(
        small=(384, 12), splus=(384, 12), base=(768, 12), large=(1024, 24)
    ).items():
        with torch.device('meta'):
            model = VECAViT(arch=arch)
        assert (model.embed_dims, model.num_layers, model.cores.shape[0]) == (dims, layers, 64)
    with torch.device('meta'):
        assert VECAViT(arch='splus').blocks[0].fc1.out_features == 2 * 384 * 4
        assert VECAViT(arch='base').blocks[0].fc1.out_features == 2 * int(768 * 2.66667)


def test_registered_in_three_libraries():
    from mmcirc.registry import model_registries

    for registry in model_registries():
        assert isinstance(registry.build(dict(type='VECAViT', arch=SMALL, patch_size=8)), VECAViT)


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(arch='huge'), "arch must be one of ('small', 'splus', 'base', 'large')"),
        (
            dict(num_cores=12),
            'num_cores must be an int in [8, num_cores_max=64] and a multiple of 8',
        ),
        (
            dict(num_cores=72),
            'num_cores must be an int in [8, num_cores_max=64] and a multiple of 8',
        ),
        (dict(num_cores='desktop'), "a multiple of 8 or a preset in ('mobile', 'edge', 'server')"),
        (dict(out_type='cls_token'), 'out_type must be one of'),
        (dict(core_chunk=7), 'core_chunk must be a positive int dividing the bank size 64'),
    ],
)
def test_bad_arguments(kwargs, message):
    with torch.device('meta'), pytest.raises(ValueError) as err:
        VECAViT(**kwargs)
    assert message in str(err.value) and '\n' not in str(err.value)


def test_set_num_cores_refuses_other_counts():
    model = VECAViT(arch=SMALL, patch_size=8)
    with pytest.raises(
        ValueError, match=r'num_cores must be an int in \[8, num_cores_max=24\] and a multiple of 8'
    ):
        model.set_num_cores(4)
    assert model.num_cores == 24


def test_bf16_autocast_close_to_fp32():
    fix, model = _loaded(out_type='raw', num_cores=16)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        cores, patches = model(fix['input'])[-1]
    ref = fix['patches_16']
    assert float((patches.float() - ref).norm() / ref.norm()) < 3e-2


@pytest.mark.parametrize('num_cores', [8, 24])
def test_attention_cost_follows_active_cores(num_cores):
    """Truncation really drops compute: the counted attention MACs equal the analytic
    count of the block-sparse pattern with C' cores (cores x (C' + N), patches x C')."""
    from mmcirc.analysis.flops import flop_counter

    model = VECAViT(arch=SMALL, patch_size=8, num_cores=num_cores).eval()
    n, d = 5 * 6, 8  # a 5 x 6 patch map, head width 16 / 2
    fc = flop_counter(model, torch.randn(1, 3, 40, 48))
    expected = SMALL['num_layers'] * 2 * 2 * d * (num_cores * (num_cores + n) + n * num_cores)
    assert fc.by_operator()['sdpa'] == expected
