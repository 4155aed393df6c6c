"""The switches of mmcirc.ops.settings: the environment read on first use, the setters, the
layout rule, and plans kept under the settings they were made with."""

import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO
from mmcirc.ops import CirculantAttention, CoreAttention, circulant_attention, settings
from mmcirc.ops.circulant_transforms import MatmulDFT, TorchFFT

KERNEL_REFUSAL = "MMCIRC_KERNEL must be one of ('torch', 'triton'), got 'bogus'"


@pytest.fixture
def fresh_env(monkeypatch):
    """Set environment variables as before the first use of the settings (read again on
    the next use); both restored afterwards."""
    monkeypatch.setattr(settings, '_now', None)
    for var in (settings.LAYOUT_ENV, settings.KERNEL_ENV):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch.setenv


def test_a_bad_value_imports_and_the_first_layer_built_says_it_in_one_line():
    code = (
        'import mmcirc\n'
        'from mmcirc.ops import CirculantAttention\n'
        'print("imported")\n'
        "CirculantAttention(4, kernel='torch')\n"
    )
    env = dict(os.environ, MMCIRC_KERNEL='bogus', PYTHONPATH=REPO)
    env.pop(settings.LAYOUT_ENV, None)
    proc = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.stdout.split('\n')[0] == 'imported', proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f'ValueError: {KERNEL_REFUSAL}'


@pytest.mark.parametrize(
    'var, value, match',
    [
        ('MMCIRC_KERNEL', 'bogus', KERNEL_REFUSAL),
        ('MMCIRC_LAYOUT', 'gpu', "MMCIRC_LAYOUT must be one of ('cpu', 'cuda'), got 'gpu'"),
    ],
)
def test_bad_environment_refused_on_first_use(fresh_env, var, value, match):
    fresh_env(var, value)
    uses = [
        lambda: CirculantAttention(4, kernel='torch'),
        lambda: CoreAttention(4, 2),
        lambda: circulant_attention(*torch.zeros(3, 1, 2, 2, 4)),
    ]
    for use in uses + uses[:1]:  # each use says it again
        with pytest.raises(ValueError) as err:
            use()
        assert str(err.value) == match


def test_environment_sets_the_layout_and_the_default_kernel(fresh_env):
    fresh_env('MMCIRC_LAYOUT', 'cuda')
    fresh_env('MMCIRC_KERNEL', 'triton')
    assert not settings.cpu_layout(torch.zeros(1))
    assert settings.current() == settings.Settings(layout='cuda', kernel='triton')
    assert [CirculantAttention(4).kernel, CirculantAttention(4, kernel='torch').kernel] == [
        'triton',
        'torch',
    ]


def test_empty_environment_is_the_default(fresh_env):
    fresh_env('MMCIRC_LAYOUT', '')
    assert settings.current() == settings.Settings()
    assert settings.cpu_layout(torch.zeros(1))


def test_forced_layout_applies_to_cpu_tensors_and_is_restored():
    with settings.forced_layout(None):
        assert settings.cpu_layout(torch.zeros(1))
        with settings.forced_layout('cuda'):
            assert not settings.cpu_layout(torch.zeros(1))
            settings.set_precision('tf32')  # a switch set inside stays set
        assert settings.cpu_layout(torch.zeros(1))
        assert settings.current().precision == 'tf32'
        settings.set_precision('ieee')


def _enter(context):
    with context:
        pass


@pytest.mark.parametrize(
    'setter, match',
    [
        (lambda: _enter(settings.forced_layout('gpu')), r"layout must be one of \('cpu', "),
        (lambda: settings.set_precision('fp8'), r"precision must be one of \('ieee', 'tf32'\)"),
        (lambda: settings.default_kernel('cuda'), r"kernel must be one of \('torch', 'triton'\)"),
    ],
)
def test_unknown_switch_value_refused_in_one_line(setter, match):
    before = settings.current()
    with pytest.raises(ValueError, match=f'^{match}.*got'):
        setter()
    assert settings.current() == before


def _plans_made(monkeypatch, cls):
    made, new = [], cls._new_plan
    monkeypatch.setattr(cls, '_new_plan', lambda s, *a: made.append(new(s, *a)) or made[-1])
    return made


def test_a_plan_is_not_reused_under_another_switch(monkeypatch):
    made = _plans_made(monkeypatch, CirculantAttention)
    layer, x = CirculantAttention(4).eval(), torch.randn(1, 12, 4)
    with torch.no_grad():
        layer(x, (3, 4))
        with settings.export_mode():
            layer(x, (3, 4))
        with settings.forced_layout('cuda'):
            layer(x, (3, 4))
        layer(x, (3, 4))  # the first plan again
    assert [type(p.tf) for p in made] == [TorchFFT, MatmulDFT, TorchFFT]
    assert [p.cpu for p in made] == [True, True, False]


def test_core_plans_keyed_on_the_settings_too(monkeypatch):
    made = _plans_made(monkeypatch, CoreAttention)
    layer, x, cores = CoreAttention(4, 2).eval(), torch.randn(1, 6, 4), torch.randn(1, 2, 4)
    with torch.no_grad():
        layer(x, cores)
        with settings.forced_layout('cuda'):
            layer(x, cores)
        layer(x, cores)
    assert made == [(6, True), (6, True)] and made[0].chunk == 6


def test_plan_cache_emptied_when_full():
    plans = {}
    for i in range(settings.PLAN_CACHE_SIZE + 1):
        assert settings.cached_plan(plans, (i,), lambda i=i: i) == i
    assert len(plans) == 1
    assert settings.cached_plan(plans, (settings.PLAN_CACHE_SIZE,), lambda: 'again') == 32


def test_graph_capture_only_while_a_graph_is_captured():
    seen = []

    def record(x):
        seen.append(settings.graph_capture())
        return x + 1

    record(torch.zeros(2))  # eager
    torch.jit.trace(record, torch.zeros(2), check_trace=False)
    assert seen == [False, True]
