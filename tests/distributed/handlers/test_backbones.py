"""Backbone parts on 2 and 3 gloo ranks against the single-process modules in float64:
the own forwards of mmcv's PatchEmbed (corner and same adaptive padding), CA-DeiT's
padded patch embedding, mmdet PVT's absolute position embedding and spatial-reduction
attention (r = 1, 2, 4, an empty reduced band at P = 3) on BandedMap bands, and VECA:
its core-periphery attention by the handler of mmcirc.distributed.handlers.veca
(the cores a replicated prefix of the banded tokens, their softmax over all patches)
and the whole VECAViT forward, unchanged, on a banded image (7 patch rows)."""

import pytest
import torch
from mmcv.cnn.bricks.transformer import PatchEmbed
from mmdet.models.backbones.pvt import AbsolutePositionEmbedding, SpatialReductionAttention

from mmcirc.models.backbones.ca_deit import PatchEmbed as DeiTPatchEmbed
from mmcirc.models.backbones.veca import CorePeripheryAttention, VECAViT
from mmcirc.distributed import BandedMap, run_parallel
from mmcirc.distributed.banded_map import shard_operators
from mmcirc.distributed.handlers import veca  # noqa: F401  (registers the handler)

TOL = dict(rtol=1e-11, atol=1e-11)
EMBEDS = {'corner_4': ('corner', 4, (13, 10)), 'same_3': ('same', 3, (13, 8))}
SRAS = {'sr_1': (1, (5, 4)), 'sr_2': (2, (7, 6)), 'sr_4': (4, (9, 8))}  # sr_4: 2 reduced rows


def _seed(name):
    torch.manual_seed(sum(map(ord, name)))


def _embed(name):
    mode, k, hw = EMBEDS[name]
    _seed(name)
    e = PatchEmbed(3, 6, kernel_size=k, stride=k, padding=mode, norm_cfg=dict(type='LN'))
    return e.double().eval(), torch.randn(1, 3, *hw, dtype=torch.float64)


def _deit():
    _seed('deit')
    return DeiTPatchEmbed(3, 6, 4).double(), torch.randn(2, 3, 13, 9, dtype=torch.float64)


def _pos():
    _seed('pos')
    p = AbsolutePositionEmbedding((4, 5), 6).double().eval()
    torch.nn.init.normal_(p.pos_embed)
    return p, torch.randn(2, 11 * 7, 6, dtype=torch.float64), (11, 7)


def _sra(name):
    sr, hw = SRAS[name]
    _seed(name)
    m = SpatialReductionAttention(8, 2, sr_ratio=sr).double().eval()
    return m, torch.randn(2, hw[0] * hw[1], 8, dtype=torch.float64), hw


def _periphery():
    _seed('veca')
    a = CorePeripheryAttention(8, 2).double().eval()
    c, (h, w), d = 3, (7, 4), 4
    x = torch.randn(2, c + h * w, 8, dtype=torch.float64)
    cos, sin = torch.randn(2, c + h * w, d, dtype=torch.float64).chunk(2, -1)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return a, x, cos, sin, c, (h, w)


def _veca():
    _seed('veca_vit')
    arch = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_ratio=2.0, num_cores=8)
    m = VECAViT(arch, patch_size=4, patch_norm=True, out_indices=(0, 1)).double().eval()
    torch.nn.init.normal_(m.core_coords)  # cores spread over the image
    return m, torch.randn(1, 3, 27, 22, dtype=torch.float64)  # 7 x 6 patches (padded)


def _tokens(x, hw):
    """Banded tokens (B, H W, C) of an H x W map (rows of W tokens)."""
    return BandedMap.scatter(x.unflatten(1, hw), band_dim=1).flatten(1, 2)


def _worker():
    out = {}
    with torch.no_grad():
        for name in EMBEDS:
            e, x = _embed(name)
            out[name] = e(BandedMap.scatter(x))[0].local
        e, x = _deit()
        out['deit_embed'] = e(BandedMap.scatter(x))[0].local
        p, x, hw = _pos()
        out['pos_embed'] = p(_tokens(x, hw), hw).local
        for name in SRAS:
            m, x, hw = _sra(name)
            out[name] = m(_tokens(x, hw), hw).local
        a, x, cos, sin, c, hw = _periphery()
        shard_operators(a)
        y = a(torch.cat([x[:, :c], _tokens(x[:, c:], hw)], 1), cos, sin, c)
        assert y.prefix == c and torch.equal(y[:, :c], y.local[:, :c])
        out['core_periphery'] = y.full_tensor()
        m, img = _veca()
        shard_operators(m)
        out['veca'] = [f.full_tensor() for f in m(BandedMap.scatter(img))]
    return out


@pytest.fixture(scope='module', params=[2, 3])
def results(request):
    return run_parallel(_worker, request.param)


def _cat(results, name):
    return torch.cat([r[name] for r in results], dim=1)


@pytest.mark.parametrize('name', list(EMBEDS))
def test_mmcv_patch_embed(results, name):
    e, x = _embed(name)
    torch.testing.assert_close(_cat(results, name), e(x)[0], **TOL)


def test_deit_patch_embed_pads_bottom_rows(results):
    e, x = _deit()
    torch.testing.assert_close(_cat(results, 'deit_embed'), e(x)[0], **TOL)


def test_position_embedding_band_of_the_resized_table(results):
    p, x, hw = _pos()
    torch.testing.assert_close(_cat(results, 'pos_embed'), p(x, hw), **TOL)


@pytest.mark.parametrize('name', list(SRAS))
def test_spatial_reduction_attention(results, name):
    m, x, hw = _sra(name)
    torch.testing.assert_close(_cat(results, name), m(x, hw), **TOL)


def test_core_periphery_cores_see_all_patches(results):
    a, x, cos, sin, c, _ = _periphery()
    with torch.no_grad():
        ref = a(x, cos, sin, c)  # (B, C' + N, D)
    for r in results:  # every rank: its cores and all bands of patches, gathered
        torch.testing.assert_close(r['core_periphery'], ref, **TOL)


def test_veca_forward_unchanged_on_a_banded_image(results):
    m, img = _veca()
    with torch.no_grad():
        refs = m(img)  # (1, 16, 7, 6) per out index
    for r in results:
        assert len(r['veca']) == len(refs)
        for got, ref in zip(r['veca'], refs):
            torch.testing.assert_close(got, ref, **TOL)
