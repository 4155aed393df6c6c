"""Bad arguments fail at build time with a ValueError naming the parameter."""

import pytest
import torch

from mmcirc.models.backbones import CAPVT, CADeiT, CASwin, CorePVT, CoreSwin, VECAViT

TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4))
VECA_TINY = dict(embed_dims=8, num_layers=1, num_heads=1, mlp_ratio=2.0, num_cores=8)

CASES = [
    # (class, kwargs, text the message must contain)
    (CAPVT, dict(arch='huge'), 'arch'),
    (CASwin, dict(arch='large'), 'arch'),
    (
        CAPVT,
        dict(arch=dict(embed_dims=(8, 16), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4))),
        'embed_dims',
    ),
    (
        CAPVT,
        dict(arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1), num_heads=(1, 2, 3, 4))),
        'depths',
    ),
    (CASwin, dict(arch=dict(embed_dims=8, depths=(1, 1, 1, 1), num_heads=(1, 2, 3))), 'num_heads'),
    (
        CAPVT,
        dict(arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 0, 1, 1), num_heads=(1, 2, 3, 4))),
        'depths',
    ),
    (CAPVT, dict(arch=dict(depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4))), 'arch'),
    (
        CAPVT,
        dict(arch=TINY, stage_attentions=('circulant', 'window', 'sra', 'sra')),
        'stage_attentions[1]',
    ),
    (
        CASwin,
        dict(arch=TINY, stage_attentions=('circulant', 'circulant', 'sra', 'window')),
        'stage_attentions[2]',
    ),
    (CAPVT, dict(arch=TINY, stage_attentions=('circulant',) * 3), 'stage_attentions'),
    (CAPVT, dict(arch=TINY, attention='linear'), 'attention'),
    (CorePVT, dict(arch=TINY, num_cores=0), 'num_cores'),
    (CorePVT, dict(arch=TINY, num_cores=65), 'num_cores'),
    (CoreSwin, dict(arch=TINY, num_cores=9, num_cores_max=8), 'num_cores'),
    (CoreSwin, dict(arch=TINY, num_cores='server', num_cores_max=32), 'num_cores'),
    (CoreSwin, dict(arch=TINY, num_cores='cloud'), 'num_cores'),
    (CorePVT, dict(arch=TINY, num_cores_max=0), 'num_cores_max'),
    (CAPVT, dict(arch=TINY, out_indices=(0, 4)), 'out_indices'),
    (CASwin, dict(arch=TINY, out_indices=(-5,)), 'out_indices'),
    (CASwin, dict(arch=TINY, out_indices=()), 'out_indices'),
    (CAPVT, dict(arch=TINY, frozen_stages=5), 'frozen_stages'),
    (CAPVT, dict(arch=TINY, boundary='reflect'), 'boundary'),
    (CASwin, dict(arch=TINY, scale='log'), 'scale'),
    (CASwin, dict(arch=TINY, scale=-1.0), 'scale'),
    (CAPVT, dict(arch=TINY, circulant_heads=3), 'circulant_heads'),
    (CAPVT, dict(arch=TINY, circulant_heads=(1, 2, 3)), 'circulant_heads'),
    (
        CorePVT,
        dict(arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(3, 2, 3, 4))),
        'num_heads[0]',
    ),
    (CAPVT, dict(arch=TINY, sr_ratios=(8, 4, 2)), 'sr_ratios'),
    (CAPVT, dict(arch=TINY, mlp_ratios=(8, 8, 4)), 'mlp_ratios'),
    (CASwin, dict(arch=TINY, strides=(4, 2, 2)), 'strides'),
    (CAPVT, dict(arch=TINY, drop_path_rate=1.5), 'drop_path_rate'),
    (CASwin, dict(arch=TINY, mlp_ratio=0), 'mlp_ratio'),
    (CoreSwin, dict(arch=TINY, mlp_ratio=-1.0), 'mlp_ratio'),
    (CAPVT, dict(arch=TINY, mlp_ratios=0), 'mlp_ratios'),
    (CAPVT, dict(arch=TINY, in_channels=0), 'in_channels'),
    (CASwin, dict(arch=TINY, in_channels=0), 'in_channels'),
    (CAPVT, dict(arch=TINY, patch_sizes=0), 'patch_sizes'),
    (CASwin, dict(arch=TINY, strides=(0, 2, 2, 2)), 'strides'),
    (CADeiT, dict(arch=dict(embed_dims=8, depth=1, mlp_ratio=0)), 'mlp_ratio'),
    (CADeiT, dict(arch=dict(embed_dims=8, depth=1), patch_size=0), 'patch_size'),
    (CADeiT, dict(arch=dict(embed_dims=8, depth=1), in_channels=0), 'in_channels'),
    (VECAViT, dict(arch=dict(VECA_TINY, mlp_ratio=0)), 'mlp_ratio'),
    (VECAViT, dict(arch=VECA_TINY, patch_size=0), 'patch_size'),
    (VECAViT, dict(arch=VECA_TINY, in_channels=0), 'in_channels'),
]


@pytest.mark.parametrize(
    'cls,kwargs,needle', CASES, ids=[f'{c.__name__}-{n}-{i}' for i, (c, _, n) in enumerate(CASES)]
)
def test_bad_argument_raises_value_error(cls, kwargs, needle):
    with pytest.raises(ValueError) as info:
        cls(**kwargs)
    assert needle in str(info.value)


def test_message_lists_allowed_values():
    with pytest.raises(ValueError, match=r"'circulant', 'core', 'sra'"):
        CAPVT(arch=TINY, stage_attentions=('circulant', 'window', 'sra', 'sra'))
    with pytest.raises(ValueError, match=r"'tiny', 'small', 'base'"):
        CASwin(arch='huge')
    with pytest.raises(ValueError, match=r'mobile'):
        CoreSwin(arch=TINY, num_cores='cloud')


@pytest.mark.parametrize('bad', [0, 65, 'cloud', 2.5, True])
def test_set_num_cores_out_of_range(bad):
    model = CorePVT(arch=TINY)
    with pytest.raises(ValueError, match='num_cores'):
        model.set_num_cores(bad)
    assert model.num_cores == 64  # unchanged


#: Every family, as registered, and the all-circulant / all-core layouts of the pyramids.
MODELS = {
    'CAPVT': lambda: CAPVT(arch=TINY),
    'CAPVT-allcirc': lambda: CAPVT(arch=TINY, stage_attentions='circulant'),
    'CorePVT': lambda: CorePVT(arch=TINY),
    'CorePVT-allcore': lambda: CorePVT(arch=TINY, stage_attentions='core'),
    'CASwin': lambda: CASwin(arch=TINY),
    'CoreSwin': lambda: CoreSwin(arch=TINY),
    'CADeiT': lambda: CADeiT(arch=dict(embed_dims=8, depth=1), patch_size=4),
    'VECAViT': lambda: VECAViT(arch=VECA_TINY, patch_size=4),
}


@pytest.mark.parametrize('name', MODELS)
def test_empty_batch_is_refused_in_one_line(name):
    model = MODELS[name]().eval()
    with pytest.raises(ValueError, match=f'{type(model).__name__}: input batch is empty') as info:
        model(torch.zeros(0, 3, 64, 64))
    assert '\n' not in str(info.value)


@pytest.mark.parametrize('name', MODELS)
def test_input_that_is_not_4d_is_refused_in_one_line(name):
    model = MODELS[name]().eval()
    with pytest.raises(ValueError, match=r'must be a \(B, C, H, W\) batch.*\(3, 64, 64\)') as info:
        model(torch.zeros(3, 64, 64))
    assert '\n' not in str(info.value)
