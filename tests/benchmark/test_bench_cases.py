"""mmcirc.benchmark.cases: the registered models are the classes they name (parameters
counted by hand against published sizes), and the extrapolated FLOP count equals the
full count."""

import pytest
import torch

from mmcirc.benchmark.cases import (
    ATTENTION_DIM,
    CASES,
    LAYERS,
    case,
    count_macs,
    group,
    register_case,
)


def _params(model):
    return sum(p.numel() for p in model.parameters())


def test_groups_and_baselines_are_registered():
    layers = ['sdpa', 'circ-circ', 'circ-zero', 'circ-linears', 'core-8', 'core-16', 'core-64']
    assert list(LAYERS) == layers
    assert group('attention') == layers + ['fft', 'kernel-ieee', 'kernel-tf32']
    assert {n: CASES[n].baseline for n in group('isotropic') if CASES[n].baseline} == {
        'ca_deit_t': 'deit_t',
        'ca_deit_s': 'deit_s',
        'ca_deit_b': 'deit_b',
        'veca_s': 'vit_s',
        'veca_b': 'vit_b',
    }
    for name in group('backbone') + group('isotropic'):
        base = CASES[name].baseline
        assert base is None or CASES[base].group == CASES[name].group
    assert all(CASES[n].flash for n in ('deit_t', 'vit_b')) and not CASES['ca_deit_t'].flash


def test_unknown_and_duplicate_cases_raise():
    with pytest.raises(ValueError, match="benchmark case must be one of .* got 'nope'"):
        case('nope')
    with pytest.raises(ValueError, match="'sdpa' is registered already"):
        register_case('sdpa', 'attention', 'x', lambda hw, depth: None)


@pytest.mark.parametrize('boundary', ['circular', 'zero'])
def test_circulant_case_is_circulant_attention(boundary):
    """The case's output equals CirculantAttention's own on the same weights and input."""
    from mmcirc.ops import CirculantAttention

    name = 'circ-circ' if boundary == 'circular' else 'circ-zero'
    model, call, x = case(name).build((6, 8), batch=2)
    assert x.shape == (2, 48, ATTENTION_DIM)
    ref = CirculantAttention(ATTENTION_DIM, boundary=boundary)
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(call(x), ref(x, (6, 8)))


def test_layers_of_other_widths_keep_heads_of_64_and_one_set_of_weights():
    sdpa, _, x = case('sdpa').build(4, dim=192)
    assert x.shape == (1, 16, 192) and sdpa.num_heads == 3
    fft, kernel = case('fft').build(4, dim=192)[0], case('kernel-ieee').build(4, dim=192)[0]
    assert (fft.kernel, kernel.kernel) == ('torch', 'triton')
    for a, b in zip(fft.state_dict().values(), kernel.state_dict().values()):
        assert torch.equal(a, b)


def test_core_case_uses_k_cores_of_a_bank_of_64():
    model, call, x = case('core-8').build(4)
    assert model.bank.shape == (64, ATTENTION_DIM) and model.num_cores == 8
    with torch.no_grad():
        y, cores = call(x)
    assert y.shape == x.shape and cores.shape[-2] == 8


def test_cadeit_parameters_follow_the_official_layout():
    """CA-DeiT-T (mmcirc's CADeiT) from DeiT-T (timm), both without a classifier, counted
    by hand: per block the attention loses the qkv bias (3C) and gains the gate
    (C^2 + C), plus a CPE (9C + C); the model drops the class token (C) and the
    197 x C position embedding."""
    pytest.importorskip('timm')
    c, depth = 192, 12
    deit = _params(case('deit_t').build(224)[0])
    ca = _params(case('ca_deit_t').build(224)[0])
    assert deit + c * 1000 + 1000 == 5_717_416  # timm's DeiT-T with its head (published 5.7 M)
    assert ca == deit + depth * (c * c + c - 3 * c + 10 * c) - c - 197 * c


def test_depth_keeps_that_many_blocks():
    pytest.importorskip('timm')
    for name in ('ca_deit_t', 'veca_s', 'deit_t'):
        model, _, x = case(name).build(32, depth=2)
        assert len(model.blocks) == 2, name
        assert x.shape == (1, 3, 32, 32)


def test_gmacs_extrapolated_from_two_blocks_equal_the_full_count():
    """count_macs(extrapolate=True) counts 1 and 2 blocks and extrapolates to 12: the same
    number as counting the whole model, and DeiT-T lands on its published 1.3 GFLOPs
    (1.26 GMACs)."""
    pytest.importorskip('timm')
    gmacs = {}
    for name in ('deit_t', 'ca_deit_t'):
        gmacs[name] = count_macs(name, (224, 224), extrapolate=True) / 1e9
        full = count_macs(name, (224, 224)) / 1e9
        assert gmacs[name] == pytest.approx(full, rel=1e-9), name
    assert gmacs['deit_t'] == pytest.approx(1.26, rel=0.02)
    assert 0 < gmacs['ca_deit_t'] < 2 * gmacs['deit_t']


def test_pyramid_cases_are_their_classes():
    """CA-Swin-T built by the case has the parameters of CASwin('tiny') built directly and
    the four Swin-T stage widths."""
    pytest.importorskip('mmdet')
    from mmcirc.models.backbones import CASwin

    model, call, x = case('ca_swin_t').build(64)
    assert _params(model) == _params(CASwin(arch='tiny'))
    with torch.no_grad():
        outs = call(x.clone())
    assert [o.shape[1] for o in outs] == [96, 192, 384, 768]


def test_gmacs_of_a_backbone_whose_train_returns_none():
    """mmdet's SwinTransformer.train() returns None (no chaining): its case is still
    counted, at the published 4.5 GFLOPs of Swin-T at 224 (Liu et al., 2021)."""
    pytest.importorskip('mmdet')
    assert count_macs('swin_t', (224, 224)) / 1e9 == pytest.approx(4.5, rel=0.02)
