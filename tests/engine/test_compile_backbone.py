"""CompileBackboneHook: a detector's backbone and neck compiled through the hook equal
the eager ones (features, gradients) in train and eval mode; the heads stay eager; a
fixed size compiles once, a new size once more, then no more.

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
    """dynamic=None: the first size static, the second symbolic, which serves a third."""
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
