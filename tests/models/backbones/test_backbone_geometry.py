"""A pyramid's stage geometry: the token grid of every stage (against a real forward) and
the smallest input it accepts (stated, tight, and a ValueError below it)."""

import pytest
import torch

from mmcirc.models.backbones import CAPVT, CASwin, CorePVT

TINY = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4))

# (class, kwargs, the minimum worked out by hand: a stage at total stride s whose SRA
# reduces keys by r sees ceil(H / s) rows and needs r of them, so H >= s * (r - 1) + 1)
CASES = [
    (CAPVT, dict(arch=TINY), 17),  # paper layout: stage 3 (s = 16) has r = 2
    (CAPVT, dict(arch=TINY, attention='sra'), 29),  # PVT-T: stage 1 (s = 4), r = 8
    (CAPVT, dict(arch=TINY, stage_attentions='circulant'), 1),
    (CorePVT, dict(arch=TINY, stage_attentions='core', num_cores=4), 1),
    (CASwin, dict(arch=TINY), 1),  # windows are padded
]


@pytest.mark.parametrize('cls,kwargs,expected', CASES)
def test_min_input_size_matches_the_layout(cls, kwargs, expected):
    assert cls(**kwargs).min_input_size == expected


@pytest.mark.parametrize('cls,kwargs,expected', [c for c in CASES if c[2] > 1])
def test_min_input_size_is_tight(cls, kwargs, expected):
    model = cls(**kwargs).eval()
    with torch.no_grad():
        model(torch.zeros(1, 3, expected, expected + 3))  # runs at the minimum
        model.min_input_size = 1  # without the check, one row less fails deep inside
        with pytest.raises(RuntimeError):
            model(torch.zeros(1, 3, expected - 1, expected + 3))


@pytest.mark.parametrize('cls,kwargs,expected', [c for c in CASES if c[2] > 1])
def test_below_the_minimum_is_a_value_error_naming_both_sizes(cls, kwargs, expected):
    model = cls(**kwargs).eval()
    with pytest.raises(
        ValueError, match=f'input size 1x40 is below the minimum {expected}x{expected}'
    ):
        model(torch.zeros(1, 3, 1, 40))


def test_one_pixel_runs_where_no_stage_reduces_keys():
    model = CAPVT(arch=TINY, stage_attentions='circulant').eval()
    with torch.no_grad():
        outs = model(torch.zeros(1, 3, 1, 1))
    assert [tuple(o.shape[-2:]) for o in outs] == [(1, 1)] * 4


# (class, kwargs, an input size at or above the layout's minimum)
GRID_CASES = [
    (CAPVT, dict(arch=TINY, attention='sra'), (97, 131)),
    (CAPVT, dict(arch=TINY, attention='sra'), (29, 45)),  # the minimum, odd strides
    (CAPVT, dict(arch=TINY, stage_attentions='circulant'), (1, 1)),
    (CASwin, dict(arch=TINY, stage_attentions='window'), (97, 131)),
    (CASwin, dict(arch=TINY, stage_attentions='circulant'), (33, 7)),
]


@pytest.mark.parametrize('cls,kwargs,hw', GRID_CASES)
def test_stage_grids_match_forward(cls, kwargs, hw):
    model = cls(**kwargs).eval()
    with torch.no_grad():
        outs = model(torch.zeros(1, 3, *hw))
    assert model.stage_grids(hw) == [tuple(o.shape[2:]) for o in outs]
