"""NestedCoreHook with VECA's official budget schedule (METHOD.md 3.2): budgets 8, 16,
..., 64 drawn with weights 1, 1, 2, 2, 3, 3, 4, 4."""

import pytest
import torch

from mmcirc.engine.hooks import NestedCoreHook, official_budgets
from mmcirc.models.backbones import VECAViT


def test_official_budgets_and_weights():
    assert official_budgets(64) == ([8, 16, 24, 32, 40, 48, 56, 64], [1, 1, 2, 2, 3, 3, 4, 4])


def test_draw_frequencies_follow_the_weights():
    hook = NestedCoreHook(64, schedule='official', seed=0)
    n = 20000
    draws = [hook.sample() for _ in range(n)]
    expected = dict(
        zip([8, 16, 24, 32, 40, 48, 56, 64], [w / 20 for w in (1, 1, 2, 2, 3, 3, 4, 4)])
    )
    assert set(draws) == set(expected)
    for k, p in expected.items():
        sd = (p * (1 - p) / n) ** 0.5
        assert abs(draws.count(k) / n - p) < 5 * sd, k


def test_sets_the_drawn_count_on_veca():
    model = torch.nn.Sequential(
        VECAViT(
            arch=dict(embed_dims=16, num_layers=1, num_heads=2, mlp_ratio=2.0, num_cores=32),
            patch_size=8,
        )
    )
    hook = NestedCoreHook(32, schedule='official', seed=1)
    seen = set()
    for _ in range(40):
        hook.set_num_cores(model, hook.sample())
        seen.add(model[0].num_cores)
    assert seen == {8, 16, 24, 32}


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(max_cores=60, schedule='official'), 'max_cores must be a multiple of chunk=8'),
        (
            dict(max_cores=64, schedule='official', eval_num_cores=12),
            'eval_num_cores must be one of [8, 16',
        ),
        (
            dict(max_cores=64, schedule='official', budget_weights=[1, 2]),
            'budget_weights must be 8 positive numbers',
        ),
        (dict(max_cores=64, schedule='veca'), "schedule must be one of ('pow2', 'official')"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError) as err:
        NestedCoreHook(**kwargs)
    assert message in str(err.value) and '\n' not in str(err.value)
