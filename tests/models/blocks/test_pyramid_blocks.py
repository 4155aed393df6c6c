"""The blocks' shared parts (:mod:`mmcirc.models.blocks.pyramid_blocks`,
:mod:`mmcirc.models.blocks.mlp_chunks`) against the modules they stand for: mmdet's
``MixFFN`` forward, mmcv's ``FFN`` and the CPE conv on an NCHW copy of the tokens."""

import pytest
import torch
from mmdet.models.backbones.pvt import MixFFN
from mmdet.models.layers import nlc_to_nchw

from mmcirc.models.blocks import mlp_chunks
from mmcirc.models.blocks.pyramid_blocks import TokenCPE, TokenMixFFN, build_ffn

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
    torch.testing.assert_close(ffn(x, identity), ref, rtol=1e-12, atol=1e-12)


def test_mixffn_on_tokens_runs_no_convolution():
    ffn = build_ffn('mixffn', 8, 24, 0.0, 0.0, dict(type='GELU')).eval()
    x = _tokens(8).float()
    with torch.profiler.profile() as prof:
        ffn(x, x)
    names = {e.key for e in prof.key_averages()}
    assert 'aten::linear' in names and not any('conv' in n for n in names)


def test_build_ffn_keeps_the_families_keys():
    mix = build_ffn('mixffn', 8, 24, 0.0, 0.0, dict(type='GELU'))
    assert isinstance(mix, TokenMixFFN)
    assert list(mix.state_dict()) == list(MixFFN(8, 24, use_conv=False).state_dict())


@pytest.mark.parametrize('act', ['GELU', 'ReLU'])
@pytest.mark.parametrize('ffn_type', ['mixffn', 'ffn'])
def test_inference_mlp_over_token_chunks_equals_the_modules_forward(monkeypatch, ffn_type, act):
    """In inference the MLP runs over chunks of tokens (8 here: 35 tokens = 4 chunks
    and a remainder of 3), equal to mmdet's MixFFN / mmcv's FFN forward on all tokens."""
    from mmcv.cnn.bricks.transformer import FFN

    monkeypatch.setattr(mlp_chunks, 'FFN_CHUNK_TOKENS', 8)
    ffn = _randomize(build_ffn(ffn_type, 8, 24, 0.0, 0.0, dict(type=act)))
    x, identity = _tokens(8), _tokens(8, seed=2)
    with torch.no_grad():
        if ffn_type == 'mixffn':
            ref = MixFFN.forward(ffn, x, HW, identity=identity)  # 1x1 convs on (B, C, H, W)
        else:
            ref = FFN.forward(ffn, x, identity=identity)
        with torch.profiler.profile() as prof:
            out = ffn(x, identity)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls['aten::addmm'] == 2 * 2 * 5  # two GEMMs per chunk, per batch element
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('ffn_type', ['mixffn', 'ffn'])
def test_inference_mlp_chunks_reuse_one_hidden_buffer(monkeypatch, ffn_type):
    """Every chunk's hidden layer is written into the same buffer (no fresh
    (chunk, C_hidden) tensor per chunk): the GELU runs in place on the storage of the
    first GEMM's output in every chunk."""
    monkeypatch.setattr(mlp_chunks, 'FFN_CHUNK_TOKENS', 8)
    ffn = _randomize(build_ffn(ffn_type, 8, 24, 0.0, 0.0, dict(type='GELU'))).float()
    x = _tokens(8).float()
    ptrs = []
    real_gelu = torch.ops.aten.gelu_

    def gelu_(h, approximate='none'):
        ptrs.append(h.untyped_storage().data_ptr())
        return real_gelu(h, approximate=approximate)

    monkeypatch.setattr(torch.ops.aten, 'gelu_', gelu_)
    with torch.no_grad():
        ffn(x, x)
    assert len(ptrs) == 2 * 5 and len(set(ptrs)) == 1


def test_inference_mlp_under_autocast_follows_autocast(monkeypatch):
    """Under autocast the chunks keep the modules' ops, so their GEMMs run in bf16."""
    monkeypatch.setattr(mlp_chunks, 'FFN_CHUNK_TOKENS', 8)
    ffn = _randomize(build_ffn('mixffn', 8, 24, 0.0, 0.0, dict(type='GELU'))).float()
    x = _tokens(8).float()
    with torch.no_grad(), torch.autocast('cpu', torch.bfloat16):
        ref = MixFFN.forward(ffn, x, HW, identity=x)
        out = ffn(x, x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_cpe_equals_conv_of_the_nchw_map(dtype):
    cpe = _randomize(TokenCPE(6)).to(dtype)
    conv = torch.nn.Conv2d(6, 6, 3, padding=1, groups=6).to(dtype)
    conv.load_state_dict(cpe.state_dict())
    x = _tokens(6).to(dtype)
    ref = conv(nlc_to_nchw(x, HW)).flatten(2).transpose(1, 2)  # (B, N, C)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(cpe(x, HW), ref, rtol=tol, atol=tol)


def test_cpe_makes_no_layout_copy():
    cpe, x = TokenCPE(6).eval(), _tokens(6).float()
    with torch.no_grad(), torch.profiler.profile() as prof:
        cpe(x, HW)
    names = {e.key for e in prof.key_averages()}
    assert not names & {'aten::contiguous', 'aten::clone', 'aten::copy_'}
