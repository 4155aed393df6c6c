"""The blocks' shared helpers (:mod:`mmcirc.models.blocks.base`) against the modules they
stand for: mmdet's ``MixFFN`` forward and the CPE conv on an NCHW copy of the tokens."""

import pytest
import torch
from mmdet.models.backbones.pvt import MixFFN
from mmdet.models.layers import nlc_to_nchw

from mmcirc.models.blocks.base import apply_ffn, build_ffn, cpe, map_as_tokens, tokens_as_map

HW = (5, 7)


def _randomize(module, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=0.3)
    return module.double().eval()


def _tokens(c, b=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, HW[0] * HW[1], c, generator=g, dtype=torch.float64)


def test_mixffn_on_tokens_equals_mmdets_mixffn():
    ffn = _randomize(build_ffn('mixffn', 8, 24, 0.0, 0.0, dict(type='GELU')))
    x, identity = _tokens(8), _tokens(8, seed=2)
    ref = MixFFN.forward(ffn, x, HW, identity=identity)  # 1x1 convs on (B, C, H, W)
    torch.testing.assert_close(apply_ffn(ffn, x, HW, identity), ref, rtol=1e-12, atol=1e-12)


def test_mixffn_on_tokens_runs_no_convolution():
    ffn = build_ffn('mixffn', 8, 24, 0.0, 0.0, dict(type='GELU')).eval()
    x = _tokens(8).float()
    with torch.profiler.profile() as prof:
        apply_ffn(ffn, x, HW, x)
    names = {e.key for e in prof.key_averages()}
    assert 'aten::linear' in names and not any('conv' in n for n in names)


def test_mixffn_with_its_depthwise_conv_is_mmdets_forward():
    ffn = _randomize(MixFFN(8, 24, use_conv=True))
    x, identity = _tokens(8), _tokens(8, seed=2)
    ref = MixFFN.forward(ffn, x, HW, identity=identity)
    torch.testing.assert_close(apply_ffn(ffn, x, HW, identity), ref, rtol=0, atol=0)


@pytest.mark.parametrize('act', ['GELU', 'ReLU'])
@pytest.mark.parametrize('ffn_type', ['mixffn', 'ffn'])
def test_inference_mlp_over_token_chunks_equals_the_modules_forward(monkeypatch, ffn_type, act):
    """In inference the MLP runs over chunks of tokens (8 here: 35 tokens = 4 chunks
    and a remainder of 3), equal to mmdet's MixFFN / mmcv's FFN forward on all tokens."""
    from mmcv.cnn.bricks.transformer import FFN

    from mmcirc.models.blocks import base

    monkeypatch.setattr(base, 'FFN_CHUNK_TOKENS', 8)
    ffn = _randomize(build_ffn(ffn_type, 8, 24, 0.0, 0.0, dict(type=act)))
    x, identity = _tokens(8), _tokens(8, seed=2)
    with torch.no_grad():
        if ffn_type == 'mixffn':
            ref = MixFFN.forward(ffn, x, HW, identity=identity)  # 1x1 convs on (B, C, H, W)
        else:
            ref = FFN.forward(ffn, x, identity=identity)
        with torch.profiler.profile() as prof:
            out = apply_ffn(ffn, x, HW, identity)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls['aten::addmm'] == 2 * 2 * 5  # two GEMMs per chunk, per batch element
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('ffn_type', ['mixffn', 'ffn'])
def test_inference_mlp_chunks_reuse_one_hidden_buffer(monkeypatch, ffn_type):
    """Every chunk's hidden layer is written into the same buffer (no fresh
    (chunk, C_hidden) tensor per chunk): the GELU runs in place on the storage of the
    first GEMM's output in every chunk."""
    from mmcirc.models.blocks import base

    monkeypatch.setattr(base, 'FFN_CHUNK_TOKENS', 8)
    ffn = _randomize(build_ffn(ffn_type, 8, 24, 0.0, 0.0, dict(type='GELU'))).float()
    x = _tokens(8).float()
    ptrs = []
    real_gelu = torch.ops.aten.gelu_

    def gelu_(h, approximate='none'):
        ptrs.append(h.untyped_storage().data_ptr())
        return real_gelu(h, approximate=approximate)

    monkeypatch.setattr(torch.ops.aten, 'gelu_', gelu_)
    with torch.no_grad():
        apply_ffn(ffn, x, HW, x)
    assert len(ptrs) == 2 * 5 and len(set(ptrs)) == 1


def test_inference_mlp_under_autocast_follows_autocast(monkeypatch):
    """Under autocast the chunks keep the modules' ops, so their GEMMs run in bf16."""
    from mmcirc.models.blocks import base

    monkeypatch.setattr(base, 'FFN_CHUNK_TOKENS', 8)
    ffn = _randomize(build_ffn('mixffn', 8, 24, 0.0, 0.0, dict(type='GELU'))).float()
    x = _tokens(8).float()
    with torch.no_grad(), torch.autocast('cpu', torch.bfloat16):
        ref = MixFFN.forward(ffn, x, HW, identity=x)
        out = apply_ffn(ffn, x, HW, x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_cpe_equals_conv_of_the_nchw_map(dtype):
    conv = _randomize(torch.nn.Conv2d(6, 6, 3, padding=1, groups=6)).to(dtype)
    x = _tokens(6).to(dtype)
    ref = conv(nlc_to_nchw(x, HW)).flatten(2).transpose(1, 2)  # (B, N, C)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(cpe(conv, x, HW), ref, rtol=tol, atol=tol)


def test_token_map_round_trip_is_a_view():
    x = _tokens(6).float()
    m = tokens_as_map(x, HW)  # (B, C, H, W) in channels-last memory
    assert m.shape == (2, 6, *HW) and m.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(m, nlc_to_nchw(x, HW), rtol=0, atol=0)
    back = map_as_tokens(m)
    assert back.data_ptr() == x.data_ptr() and torch.equal(back, x)
