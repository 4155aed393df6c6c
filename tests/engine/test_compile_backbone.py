"""CompileBackboneHook: a detector's backbone and neck compiled through the hook equal
the eager ones (features, gradients) in train and eval mode; the heads stay eager; a
fixed size compiles once, a new size once more, then no more (on the CUDA layout the
first graph's sizes are symbolic); past the recompile limit a size runs eagerly with one
warning line, and twelve sizes of a pyramid finish.

The hook runs on the detector of tests/fixtures/configs/ca_pvt_retinanet_tiny.py (tiny
CA-PVT + FPN + RetinaNet head); the reference is an eager copy made before compiling.
Backends: ``aot_eager`` (dynamo's graph and AOT autograd's backward, run by eager kernels:
what was captured, without inductor's C++ build) for the values, ``eager`` (dynamo alone)
for the graph counts.
"""

import copy
import logging
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from helpers import FIXTURE_CONFIGS
from mmcirc.engine.compile import (
    CompileBackboneHook,
    add_compile_hook,
    compile_backbone,
    compiled_graphs,
    is_compiled,
)

pytestmark = pytest.mark.usefixtures('one_torch_thread')


class FakeRunner:
    def __init__(self, model):
        self.model, self.iter = model, 0
        self.logger = logging.getLogger('fake-runner')


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _detector():
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    import mmcirc  # noqa: F401  (registers the backbones)

    init_default_scope('mmdet')
    cfg = Config.fromfile(osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py'))
    cfg.model.backbone.drop_path_rate = 0.0  # train mode without randomness
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model


def _assert_rounding(out, ref, tol=1e-5):
    """``out`` equals ``ref`` to float32 rounding: within ``tol`` of ``ref``'s largest
    magnitude (a sum of squares makes gradients of 1e3 and elements near 0)."""
    torch.testing.assert_close(out, ref, rtol=0, atol=tol * float(ref.abs().max()))


def _features_and_grads(model, x):
    x = x.clone().requires_grad_(True)
    feats = model.extract_feat(x)
    params = [p for p in [*model.backbone.parameters(), *model.neck.parameters()]]
    grads = torch.autograd.grad(sum(f.square().sum() for f in feats), [x, *params])
    return [f.detach() for f in feats], grads


def test_compiled_backbone_and_neck_equal_eager_in_train_and_eval_mode():
    model = _detector()
    ref = copy.deepcopy(model)
    CompileBackboneHook(backend='aot_eager').before_train(FakeRunner(model))
    assert is_compiled(model.backbone) and is_compiled(model.neck)
    assert not is_compiled(model.bbox_head)
    x = torch.randn(2, 3, 64, 96)

    model.train(), ref.train()
    (feats, grads), (ref_feats, ref_grads) = (
        _features_and_grads(model, x),
        _features_and_grads(ref, x),
    )
    assert len(feats) == len(ref_feats) == 5  # FPN's levels
    for f, r in zip(feats, ref_feats):
        _assert_rounding(f, r)
    assert len(grads) == len(ref_grads) > 10  # the input and every backbone / neck parameter
    for g, r in zip(grads, ref_grads):
        _assert_rounding(g, r)

    model.eval(), ref.eval()
    with torch.no_grad():
        for f, r in zip(model.extract_feat(x), ref.extract_feat(x)):
            _assert_rounding(f, r)


def test_a_fixed_size_compiles_once_and_a_new_size_once_more():
    """dynamic=None on the CPU layout: the first size static, the second symbolic, which
    serves a third."""
    model = _detector()
    runner = FakeRunner(model)
    hook = CompileBackboneHook(backend='eager')
    hook.before_train(runner)
    start = compiled_graphs()
    counts = []
    with torch.no_grad():
        for i, hw in enumerate([(64, 96), (64, 96), (96, 64), (128, 96), (128, 96)]):
            runner.iter = i
            hook.before_train_iter(runner, i)
            model.extract_feat(torch.randn(1, 3, *hw))
            hook.after_train_iter(runner, i)
            counts.append(compiled_graphs() - start)
    assert counts == [2, 2, 4, 4, 4]  # backbone + neck: static, then symbolic
    assert hook.recompiles == 2


class _TokenMapBackbone(torch.nn.Module):
    """A patch embedding (stride 4), a linear on the tokens and a depthwise conv of their
    (B, C, H/4, W/4) channels-last view, as a pyramid block's positional encoding: the
    view is kept for the backward, with strides 64 * (W // 4) and 64 when sizes are
    symbolic."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 64, 4, stride=4)
        self.linear = torch.nn.Linear(64, 64)
        self.cpe = torch.nn.Conv2d(64, 64, 3, padding=1, groups=64)

    def forward(self, x):
        e = self.embed(x)
        b, c, h, w = e.shape
        t = self.linear(e.flatten(2).transpose(1, 2))  # (B, N, C)
        return [self.cpe(t.reshape(b, h, w, c).permute(0, 3, 1, 2))]


def test_inductor_compiles_a_changed_size_with_symbolic_strides():
    """A new size compiles symbolic (dynamic=None) and inductor orders the strides of the
    views a training graph keeps (64 * (W // 4) against 64) without deciding between
    them; the features equal eager's at both sizes."""
    model = torch.nn.Module()
    model.backbone = _TokenMapBackbone()
    ref = copy.deepcopy(model.backbone)
    assert compile_backbone(model, backend='inductor', neck=False) == ['backbone']
    for hw in [(32, 48), (48, 64)]:
        x = torch.randn(2, 3, *hw)
        _assert_rounding(model.backbone(x)[0].detach(), ref(x)[0].detach())


@pytest.mark.parametrize('layout, graphs', [('cuda', 1), ('cpu', 2)])
def test_the_cuda_layout_compiles_symbolic_sizes_from_the_first_call(layout, graphs):
    """The input's height and width marked dynamic where the layout allows (CUDA: one
    graph for every size); the CPU layout compiles the first size static."""
    from mmcirc.ops.settings import forced_layout

    model = torch.nn.Module()
    model.backbone = _TokenMapBackbone()
    compile_backbone(model, backend='eager', neck=False)
    start = compiled_graphs()
    with forced_layout(layout), torch.no_grad():
        for hw in [(32, 48), (48, 64), (64, 32)]:
            model.backbone(torch.randn(1, 3, *hw))
    assert compiled_graphs() - start == graphs


def test_the_hook_refuses_what_torch_compile_refuses():
    for kwargs, word in (
        (dict(backend='nope'), 'backend must be a torch.compile backend'),
        (dict(mode='nope'), 'mode: Unrecognized mode=nope'),
        (dict(dynamic='yes'), 'dynamic must be one of (None, True, False)'),
    ):
        with pytest.raises(ValueError, match=r'^CompileBackboneHook: ') as err:
            CompileBackboneHook(**kwargs)
        assert word in str(err.value) and '\n' not in str(err.value)
    with pytest.raises(TypeError, match='neck must be True or False'):
        CompileBackboneHook(neck='yes')


def test_add_compile_hook_adds_one_hook_or_sets_the_configs_own():
    cfg = Config(dict(custom_hooks=[dict(type='EMAHook')]))
    add_compile_hook(cfg, 'eager')
    add_compile_hook(cfg, 'aot_eager')
    assert cfg.custom_hooks == [
        dict(type='EMAHook'),
        dict(type='CompileBackboneHook', backend='aot_eager'),
    ]
    with pytest.raises(ValueError, match='backend must be a torch.compile backend'):
        add_compile_hook(Config(), 'nope')


class _SizeLoop(torch.nn.Module):
    """A convolution applied once per 16 rows of the input: the graph depends on the
    height through a Python loop, so every such count compiles its own graph."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        for _ in range(int(x.shape[2]) // 16):
            y = y + self.conv(x)
        return [y]


def _run_sizes(model, hook, sizes):
    """Each size through the hook as a training iteration; the outputs."""
    runner = FakeRunner(model)
    hook.before_train(runner)
    outs = []
    with torch.no_grad():
        for i, hw in enumerate(sizes):
            runner.iter = i
            hook.before_train_iter(runner, i)
            x = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(i))
            outs.append((x, model.backbone(x)[0]))
            hook.after_train_iter(runner, i)
    return outs


def test_past_the_recompile_limit_a_size_runs_eagerly_with_one_warning(caplog, capfd):
    model = torch.nn.Module()
    model.backbone = _SizeLoop()
    ref = copy.deepcopy(model.backbone)
    sizes = [(16 * k, 20) for k in (1, 2, 3, 4, 5, 1, 6)]
    with torch._dynamo.config.patch(recompile_limit=2), caplog.at_level(logging.INFO):
        outs = _run_sizes(model, CompileBackboneHook(backend='eager', neck=False), sizes)
    with torch.no_grad():
        for x, y in outs:  # eager or compiled, each equals the eager module
            torch.testing.assert_close(y, ref(x)[0])
    said = [r.getMessage() for r in caplog.records if 'recompile limit' in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "compile: the backbone reached torch.compile's recompile limit (2) at input 48x20;"
    ), said
    assert 'hit config.recompile_limit' not in capfd.readouterr().err  # dynamo's own lines


def test_twelve_sizes_of_a_pyramid_finish_through_the_hook(caplog):
    """Multi-scale training's random sizes on the CPU layout, where a pyramid compiles a
    graph per size: past the limit (1 here, to trace once; 8 by default, which the ninth
    size of such a run passed with an exception) every size runs eagerly and equals
    eager, said in one line."""
    from mmcirc.models.backbones.ca_pvt import CAPVT

    torch.manual_seed(0)
    arch = dict(embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])
    model = torch.nn.Module()
    model.backbone = CAPVT(arch=arch).eval()
    ref = copy.deepcopy(model.backbone)
    sizes = [(32 + 16 * (k % 4), 32 + 24 * (k // 4)) for k in range(12)]
    hook = CompileBackboneHook(backend='eager', neck=False)
    with torch._dynamo.config.patch(recompile_limit=1), caplog.at_level(logging.WARNING):
        outs = _run_sizes(model, hook, sizes)
    assert len(outs) == 12
    with torch.no_grad():
        for x, y in outs:
            _assert_rounding(y, ref(x)[0])
    said = [r.getMessage() for r in caplog.records if 'recompile limit' in r.getMessage()]
    assert len(said) == 1 and 'limit (1) at input 48x32;' in said[0], said
