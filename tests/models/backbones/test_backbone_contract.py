"""The mmdet/mmseg/mmpretrain backbone contract: frozen_stages, norm_eval, with_cp,
drop_path_rate, init_cfg=Pretrained, train()."""

import pytest
import torch
from torch import nn

from mmcirc.models.backbones import CAPVT, CASwin, CirculantBlock, CoreBlock
from mmcirc.ops.circulant import CirculantAttention

TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 2, 1), num_heads=(1, 2, 3, 4))
MIXED = ('core', 'circulant', None, 'core')  # None -> the family's original attention


def build(cls, **kwargs):
    orig = 'sra' if cls is CAPVT else 'window'
    kwargs.setdefault('stage_attentions', tuple(orig if a is None else a for a in MIXED))
    model = cls(arch=TINY, num_cores_max=8, **kwargs)
    model.init_weights()
    return model


def frozen_parts(model, frozen_stages):
    """Modules that frozen_stages must freeze, listed from the mmdet naming."""
    if isinstance(model, CAPVT):
        parts = [model.layers[0].patch_embed, model.layers[0].pos_embed]
        parts += [model.layers[i] for i in range(frozen_stages)]
    else:
        parts = [model.patch_embed]
        parts += [model.stages[i] for i in range(frozen_stages)]
        parts += [getattr(model, f'norm{i}') for i in range(frozen_stages)]
    return parts


@pytest.mark.parametrize('frozen_stages', [0, 1, 2, 4])
@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_frozen_stages_get_no_gradient(cls, frozen_stages):
    torch.manual_seed(0)
    model = build(cls, frozen_stages=frozen_stages)
    model.train()
    frozen = {id(p) for m in frozen_parts(model, frozen_stages) for p in m.parameters()}
    assert frozen
    outs = model(torch.randn(2, 3, 48, 64))
    loss = sum(o.sum() for o in outs)
    if loss.requires_grad:
        loss.backward()
    for name, p in model.named_parameters():
        if id(p) in frozen:
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.requires_grad and p.grad is not None, name
    for m in frozen_parts(model, frozen_stages):
        assert not any(sub.training for sub in m.modules())


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_train_keeps_frozen_stages_in_eval(cls):
    model = build(cls, frozen_stages=2, drop_rate=0.1)
    model.train()
    parts = frozen_parts(model, 2)
    assert all(not m.training for part in parts for m in part.modules())
    later = model.stages[3]
    assert later.training
    model.eval()
    model.train(True)
    assert all(not m.training for part in parts for m in part.modules())
    assert all(p.requires_grad is False for part in parts for p in part.parameters())


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_norm_eval(cls):
    model = build(cls, norm_eval=True)
    model.train()
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(not m.training for m in norms)
    assert any(m.training for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_with_cp_same_result_and_gradients(cls):
    torch.manual_seed(0)
    plain = build(cls)
    cp = build(cls, with_cp=True)
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 40, 72)
    grads = []
    for model in (plain, cp):
        model.train()
        torch.manual_seed(1)
        outs = model(x)
        sum(o.square().sum() for o in outs).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_with_cp_checkpoints_each_block(monkeypatch):
    calls = []
    import mmcirc.models.backbones.pyramid as pyramid

    real = pyramid.checkpoint
    monkeypatch.setattr(
        pyramid, 'checkpoint', lambda fn, *a, **k: calls.append(fn) or real(fn, *a, **k)
    )
    model = build(CASwin, with_cp=True)
    model.train()
    sum(o.sum() for o in model(torch.randn(1, 3, 32, 32))).backward()
    assert len(calls) == sum(TINY['depths'])


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_drop_path_rate_linear_over_all_blocks(cls):
    model = build(cls, drop_path_rate=0.3)
    rates = []
    for stage in model.stages:
        for block in stage.blocks:
            rates.append(block.ffn.dropout_layer.drop_prob)
    total = sum(TINY['depths'])
    expected = [0.3 * k / (total - 1) for k in range(total)]
    assert rates == pytest.approx(expected)


@pytest.mark.parametrize('cls', [CAPVT, CASwin])
def test_init_cfg_pretrained_with_prefix(cls, tmp_path):
    torch.manual_seed(0)
    source = build(cls)
    ckpt = tmp_path / 'detector.pth'
    torch.save(
        {'state_dict': {f'backbone.{k}': v for k, v in source.state_dict().items()}, 'meta': {}},
        ckpt,
    )
    torch.manual_seed(1)
    target = cls(
        arch=TINY,
        stage_attentions=source.stage_attentions,
        num_cores_max=8,
        init_cfg=dict(type='Pretrained', checkpoint=str(ckpt), prefix='backbone.'),
    )
    target.init_weights()
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_boundary_and_scale_reach_every_circulant_block():
    for cls in (CAPVT, CASwin):
        model = cls(
            arch=TINY,
            stage_attentions='circulant',
            boundary='zero',
            scale='n',
            circulant_heads=(2, 4, 4, 8),
        )
        attns = [m for m in model.modules() if isinstance(m, CirculantAttention)]
        assert len(attns) == sum(TINY['depths'])
        assert all(a.boundary == 'zero' and a.scale == 'n' for a in attns)
        assert [a.num_heads for a in attns] == [2, 4, 4, 4, 8]


def test_default_heads_one_per_channel_and_paper_layout():
    model = CAPVT(arch='tiny')
    assert model.stage_attentions == ('circulant', 'circulant', 'sra', 'sra')
    attns = [m for m in model.modules() if isinstance(m, CirculantAttention)]
    assert all(a.num_heads == a.dim for a in attns)
    assert CASwin(arch='tiny', attention='core').stage_attentions == (
        'core',
        'core',
        'window',
        'window',
    )
    assert CASwin(arch='tiny', stage_attentions='circulant').stage_attentions == ('circulant',) * 4


def test_block_types_and_cpe():
    pvt = CAPVT(arch=TINY, stage_attentions=('circulant', 'core', 'sra', 'sra'))
    swin = CASwin(arch=TINY, stage_attentions=('circulant', 'core', 'window', 'window'))
    for model in (pvt, swin):
        stages = model.stages
        assert all(isinstance(b, CirculantBlock) and b.cpe is not None for b in stages[0].blocks)
        assert all(isinstance(b, CoreBlock) for b in stages[1].blocks)
    assert pvt.layers[1].blocks[0].cpe is None  # PVT has absolute position embeddings
    assert swin.stages[1].blocks[0].cpe is not None  # Swin has none: CPE in core blocks
