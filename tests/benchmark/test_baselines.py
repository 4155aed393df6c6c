"""mmcirc.benchmark.baselines: the benchmarks' baseline attention against softmax
attention written out, the elastic core bank, bad arguments, the registry, and an
import with torch alone."""

import math
import os.path as osp

import pytest
import torch

from helpers import REPO, run_torch_only, torch_only_origin
from mmcirc.benchmark.baselines import CoreAttentionWithBank, MHASelfAttention, SDPASelfAttention

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _softmax_attention(q, k, v, heads):
    """(B, N, C) q, k, v -> softmax(q k^T / sqrt(C / heads)) v per head, concatenated."""
    b, n, c = q.shape
    d = c // heads
    q, k, v = (t.reshape(b, n, heads, d).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)  # (B, heads, N, N)
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    weights = weights / weights.sum(-1, keepdim=True)
    return (weights @ v).transpose(1, 2).reshape(b, n, c)


def test_sdpa_self_attention_is_softmax_attention():
    torch.manual_seed(0)
    m = SDPASelfAttention(8, num_heads=2)
    x = torch.randn(2, 12, 8)
    wq, wk, wv = m.qkv.weight.chunk(3)
    bq, bk, bv = m.qkv.bias.chunk(3)
    o = _softmax_attention(x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv, heads=2)
    torch.testing.assert_close(m(x), o @ m.proj.weight.T + m.proj.bias, rtol=1e-5, atol=1e-6)


def test_mha_self_attention_is_softmax_attention():
    torch.manual_seed(0)
    m = MHASelfAttention(8, num_heads=2)
    x = torch.randn(2, 12, 8)
    w, bias = m.attn.in_proj_weight.chunk(3), m.attn.in_proj_bias.chunk(3)
    o = _softmax_attention(*(x @ wi.T + bi for wi, bi in zip(w, bias)), heads=2)
    ref = o @ m.attn.out_proj.weight.T + m.attn.out_proj.bias
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-6)


def test_core_bank_only_its_first_cores_take_part():
    torch.manual_seed(0)
    m = CoreAttentionWithBank(8, num_heads=2, num_cores=3, bank_size=5)
    x = torch.randn(2, 10, 8)
    y, cores = m(x)
    assert y.shape == (2, 10, 8) and cores.shape == (2, 3, 8)
    with torch.no_grad():
        m.bank[3:] += 1.0  # inactive cores
    torch.testing.assert_close(m(x)[0], y, rtol=0, atol=0)
    with torch.no_grad():
        m.bank[0] += 1.0  # an active core
    assert not torch.allclose(m(x)[0], y)


@pytest.mark.parametrize(
    'make,name',
    [
        (lambda: SDPASelfAttention(6, num_heads=4), 'num_heads'),
        (lambda: MHASelfAttention(0), 'dim'),
        (lambda: CoreAttentionWithBank(8, num_cores=9, bank_size=8), 'num_cores'),
        (lambda: CoreAttentionWithBank(8, bank_size=0), 'bank_size'),
    ],
)
def test_bad_arguments_name_the_parameter(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_registered_for_configs():
    from mmdet.registry import MODELS

    m = MODELS.build(
        dict(type='CoreAttentionWithBank', dim=8, num_heads=2, num_cores=4, bank_size=4)
    )
    assert isinstance(m, CoreAttentionWithBank) and m.bank.shape == (4, 8)


SCRIPT = r"""
import torch
from mmcirc.benchmark.baselines import CoreAttentionWithBank, SDPASelfAttention
x = torch.randn(1, 16, 8)
print(tuple(SDPASelfAttention(8)(x).shape), tuple(CoreAttentionWithBank(8, 1, 2, 4)(x)[1].shape))
"""


def test_import_with_torch_only():
    proc = run_torch_only(code=SCRIPT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[0] == '(1, 16, 8) (1, 2, 8)'
    assert torch_only_origin(proc) == dict(mmcirc=osp.join(REPO, 'mmcirc', '__init__.py'), mm=[])


def test_sdpa_baseline_is_an_attention_layer_for_the_flop_counter():
    from mmcirc.analysis import attention_modules

    net = torch.nn.Sequential(torch.nn.Linear(8, 8), SDPASelfAttention(8, num_heads=2))
    assert attention_modules(net) == ['1']
