"""The mmdet/mmseg/mmpretrain backbone contract, over every registered mmcirc backbone:
out_indices, frozen_stages (requires_grad off, eval mode kept through train()),
norm_eval, with_cp (same outputs and gradients, one checkpoint per block), elastic
cores, init_cfg=Pretrained; then the pyramids' drop_path_rate and block options."""

import inspect
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import nn

import mmcirc  # noqa: F401  (registration)
from mmcirc.models.backbones import CADeiT, CAPVT, CASwin, CirculantBlock, CoreBlock, VECAViT
from mmcirc.models.backbones.contract import BackboneContract
from mmcirc.ops.circulant import CirculantAttention
from mmcirc.registry import model_registries

TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 2, 1), num_heads=(1, 2, 3, 4))
MIXED = ('core', 'circulant', None, 'core')  # None -> the family's original attention


def _pvt_frozen(k):  # mmdet's PVT: the first patch/position embedding, then layers.{i}
    stem = ['layers.0.patch_embed.', 'layers.0.pos_embed.'] if k >= 0 else []
    return stem + [f'layers.{i}.' for i in range(k)]


def _swin_frozen(k):  # mmdet's Swin: patch embedding, then stages.{i} with norm{i}
    stem = ['patch_embed.', 'drop_after_pos.'] if k >= 0 else []
    return stem + [p for i in range(k) for p in (f'stages.{i}.', f'norm{i}.')]


def _deit_frozen(k, depth=3):  # patch embedding, blocks.{i}, all of them: also the norm
    parts = ['patch_embed.'] if k >= 0 else []
    return parts + [f'blocks.{i}.' for i in range(k)] + (['norm.'] if k == depth else [])


def _veca_frozen(k, layers=3):  # patch embedding; the bank and its coordinates; all
    if k == layers:
        return ['']
    parts = ['patch_embed.'] if k >= 0 else []
    if k >= 1:
        parts += ['cores', 'core_coords', 'pos_alpha'] + [f'blocks.{i}.' for i in range(k)]
        parts += [f'pos_linears.{i}.' for i in range(k - 1)]
    return parts


@dataclass
class Spec:
    """A tiny build of one family and what the contract means for it."""

    kwargs: Callable[[type], dict]
    num_stages: int  # what out_indices / frozen_stages count
    num_blocks: int
    frozen: Callable[[int], list]  # parameter / module name prefixes frozen by k
    size: tuple = (48, 64)
    core_step: int = 0  # 0: no core bank


def _pyramid_kwargs(cls):
    kinds = tuple(cls.original_attention if a is None else a for a in MIXED)
    return dict(arch=TINY, stage_attentions=kinds, num_cores_max=16)


SPECS = {
    CAPVT: Spec(_pyramid_kwargs, 4, 5, _pvt_frozen, core_step=1),
    CASwin: Spec(_pyramid_kwargs, 4, 5, _swin_frozen, core_step=1),
    CADeiT: Spec(
        lambda cls: dict(arch=dict(embed_dims=16, depth=3), patch_size=8),
        3,
        3,
        _deit_frozen,
        size=(32, 48),
    ),
    VECAViT: Spec(
        lambda cls: dict(
            arch=dict(embed_dims=16, num_layers=3, num_heads=2, mlp_ratio=2.0, num_cores=16),
            patch_size=8,
        ),
        3,
        3,
        _veca_frozen,
        size=(32, 48),
        core_step=8,
    ),
}


def registered_backbones():
    """mmcirc's backbones as the registry lists them (not a hand-kept list)."""
    reg = model_registries()[0].module_dict
    return [
        cls
        for cls in reg.values()
        if inspect.isclass(cls) and cls.__module__.startswith('mmcirc.models.backbones.')
    ]


BACKBONES = registered_backbones()
IDS = [c.__name__ for c in BACKBONES]


def spec_of(cls) -> Spec:
    return next(s for base, s in SPECS.items() if issubclass(cls, base))


def build(cls, **kwargs):
    torch.manual_seed(0)
    model = cls(**dict(spec_of(cls).kwargs(cls), **kwargs))
    model.init_weights()
    return model


def image(cls, batch=2):
    torch.manual_seed(2)
    return torch.randn(batch, 3, *spec_of(cls).size)


def flat(outs):
    """Output tensors of a forward (VECA's 'raw' / pairs flattened)."""
    out = []
    for o in outs:
        out += flat(o) if isinstance(o, (tuple, list)) else [o]
    return out


def frozen_name(name, prefixes):
    return any(p == '' or name == p or (p.endswith('.') and name.startswith(p)) for p in prefixes)


def test_the_registry_lists_every_family_and_each_keeps_the_contract():
    names = set(IDS)
    assert {'CAPVT', 'CorePVT', 'CASwin', 'CoreSwin', 'CADeiT', 'VECAViT'} <= names
    for cls in BACKBONES:
        assert issubclass(cls, BackboneContract), cls
        assert any(issubclass(cls, base) for base in SPECS), f'{cls.__name__}: no tiny spec'


@pytest.mark.parametrize('cls', BACKBONES, ids=IDS)
def test_out_indices_select_and_normalise(cls):
    n = spec_of(cls).num_stages
    every = build(cls, out_indices=tuple(range(n))).eval()
    some = cls(**dict(spec_of(cls).kwargs(cls), out_indices=(-1, 0, n - 1)))
    assert some.out_indices == (0, n - 1)
    missing, _ = some.load_state_dict(every.state_dict(), strict=False)
    assert not missing  # out_indices changes which outputs exist, not the weights
    some.eval()
    x = image(cls)
    with torch.no_grad():
        full, picked = flat(every(x)), flat(some(x))
    per = len(full) // n  # VECA 'featmap' gives one tensor per index
    assert len(picked) == 2 * per
    for a, b in zip(picked, full[:per] + full[-per:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for bad in (n, -n - 1, (), 1.0):
        with pytest.raises(ValueError, match='out_indices'):
            cls(**dict(spec_of(cls).kwargs(cls), out_indices=bad))


@pytest.mark.parametrize('frozen_stages', [0, 1, 2, 'all'])
@pytest.mark.parametrize('cls', BACKBONES, ids=IDS)
def test_frozen_stages_get_no_gradient(cls, frozen_stages):
    spec = spec_of(cls)
    k = spec.num_stages if frozen_stages == 'all' else frozen_stages
    model = build(cls, frozen_stages=k)
    model.train()
    prefixes = spec.frozen(k)
    frozen = {n for n, _ in model.named_parameters() if frozen_name(n, prefixes)}
    assert frozen
    loss = sum(o.float().sum() for o in flat(model(image(cls))))
    if loss.requires_grad:
        loss.backward()
    for name, p in model.named_parameters():
        if name in frozen:
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.requires_grad and p.grad is not None, name
    with pytest.raises(ValueError, match='frozen_stages'):
        cls(**dict(spec.kwargs(cls), frozen_stages=spec.num_stages + 1))


@pytest.mark.parametrize('cls', BACKBONES, ids=IDS)
def test_train_keeps_frozen_stages_in_eval(cls):
    spec = spec_of(cls)
    for k in (1, spec.num_stages):
        model = build(cls, frozen_stages=k)
        prefixes = [p for p in spec.frozen(k) if p == '' or p.endswith('.')]
        for mode in ('train', 'eval', 'train'):
            getattr(model, mode)()
            for name, m in model.named_modules():
                if not name or isinstance(m, nn.ModuleList):  # containers run nothing
                    continue
                if frozen_name(name + '.', prefixes):
                    assert not m.training, (k, mode, name)
                elif mode == 'train':
                    assert m.training, (k, mode, name)
            assert not any(
                p.requires_grad for n, p in model.named_parameters() if frozen_name(n, prefixes)
            )


@pytest.mark.parametrize(
    'cls',
    [c for c in BACKBONES if 'norm_eval' in inspect.signature(c).parameters],
    ids=[c.__name__ for c in BACKBONES if 'norm_eval' in inspect.signature(c).parameters],
)
def test_norm_eval(cls):
    model = build(cls, norm_eval=True)
    model.train()
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(not m.training for m in norms)
    assert any(m.training for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize('cls', BACKBONES, ids=IDS)
def test_with_cp_same_result_and_gradients(cls, monkeypatch):
    import mmcirc.models.backbones.contract as contract

    calls = []
    real = contract.checkpoint
    monkeypatch.setattr(
        contract, 'checkpoint', lambda fn, *a, **k: calls.append(fn) or real(fn, *a, **k)
    )
    plain, cp = build(cls), build(cls, with_cp=True)
    cp.load_state_dict(plain.state_dict())
    x = image(cls, batch=1)
    results = []
    for model in (plain, cp):
        model.train()
        torch.manual_seed(1)  # the same drop paths / coordinate augmentation in both
        outs = flat(model(x))
        sum(o.square().sum() for o in outs).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append(([o.detach() for o in outs], grads))
    assert len(calls) == spec_of(cls).num_blocks  # every block, only with with_cp
    for a, b in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for name, g in results[0][1].items():
        torch.testing.assert_close(g, results[1][1][name], rtol=1e-4, atol=1e-6, msg=name)


def _banks(model):
    """The core banks and their coordinates: (C_max, ...) parameters, row = core."""
    return [p for n, p in model.named_parameters() if n.split('.')[-1] in ('cores', 'core_coords')]


@pytest.mark.parametrize('cls', BACKBONES, ids=IDS)
def test_elastic_cores(cls):
    step = spec_of(cls).core_step
    model = build(cls).eval()
    if not step:  # no core bank: no core count to set either
        assert not _banks(model) and not hasattr(model, 'set_num_cores')
        return
    assert model.num_cores == model.num_cores_max == 16
    few = build(cls, num_cores=8).eval()  # C' from the constructor: the reference
    x = image(cls)
    with torch.no_grad():
        full = flat(model(x))
        model.set_num_cores(8)
        assert model.num_cores == 8
        ref, got = flat(few(x)), flat(model(x))
        for bank in _banks(model):
            bank[8:].add_(1.0)  # cores beyond C' are not used
        unused = flat(model(x))
    for a, b, c, f in zip(ref, got, unused, full):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=0, atol=0)
        assert a.shape == f.shape and not torch.allclose(a, f)
    model.set_num_cores('mobile')
    assert model.num_cores == 8
    bad = [0, 17, 'cloud', 2.5, True] + ([12] if step > 1 else [])
    for value in bad:
        with pytest.raises(ValueError, match='num_cores'):
            model.set_num_cores(value)
        with pytest.raises(ValueError, match='num_cores'):
            cls(**dict(spec_of(cls).kwargs(cls), num_cores=value))
    assert model.num_cores == 8


@pytest.mark.parametrize('cls', BACKBONES, ids=IDS)
def test_init_cfg_pretrained_with_prefix(cls, tmp_path):
    source = build(cls)
    ckpt = tmp_path / 'detector.pth'
    torch.save(
        {'state_dict': {f'backbone.{k}': v for k, v in source.state_dict().items()}, 'meta': {}},
        ckpt,
    )
    torch.manual_seed(1)
    init = dict(type='Pretrained', checkpoint=str(ckpt), prefix='backbone.')
    target = cls(**dict(spec_of(cls).kwargs(cls), init_cfg=init))
    target.init_weights()
    assert list(target.state_dict()) == list(source.state_dict())
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


# --------------------------------------------------------------------------- pyramids
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
