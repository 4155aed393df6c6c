"""torch.compile keeps every backbone family whole: one graph, no break, equal to eager.

``torch._dynamo.explain`` counts the graphs and breaks (dynamo only, no code
generation); the compiled run uses the ``aot_eager`` backend (AOT autograd's traced
graph run by eager kernels), which checks what dynamo captured without inductor's
C++ build on the CPU.
"""

import pytest
import torch

TINY_PVT = dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2))
BACKBONES = {
    'CAPVT': dict(type='CAPVT', arch=TINY_PVT),  # circulant stages 1-2, SRA 3-4
    'CAPVT-zero': dict(type='CAPVT', arch=TINY_PVT, boundary='zero'),
    'CorePVT': dict(type='CorePVT', arch=TINY_PVT, num_cores_max=4),
    'CASwin': dict(
        type='CASwin',
        arch=dict(embed_dims=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2)),
        window_size=2,
    ),
    # the released isotropic models: circulant (CA-DeiT), core-periphery + RoPE (VECA)
    'CADeiT': dict(type='CADeiT', arch=dict(embed_dims=16, depth=2), out_indices=(0, 1)),
    'VECAViT': dict(
        type='VECAViT',
        arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_ratio=2.0, num_cores=8),
        out_indices=(0, 1),
    ),
}
NUM_OUTS = {'CADeiT': 2, 'VECAViT': 2}  # the pyramids: 4


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize('name', list(BACKBONES))
def test_backbone_compiles_to_one_graph_equal_to_eager(name):
    import mmcirc  # noqa: F401  (registers the backbones)
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    init_default_scope('mmdet')
    torch.manual_seed(0)
    backbone = MODELS.build(dict(BACKBONES[name])).eval()
    backbone.init_weights()
    x = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        explain = torch._dynamo.explain(backbone)(x)
        assert explain.graph_break_count == 0, explain.break_reasons
        assert explain.graph_count == 1
        ref = backbone(x)
        out = torch.compile(backbone, backend='aot_eager', fullgraph=True)(x)
    assert len(out) == len(ref) == NUM_OUTS.get(name, 4)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', list(BACKBONES))
def test_backbone_compiles_whole_in_train_mode_forward_and_backward(name):
    """fullgraph=True in train mode with autograd: no graph break and no host
    synchronisation (a data-dependent read would break the graph); the outputs and the
    input's gradient equal eager's."""
    import mmcirc  # noqa: F401  (registers the backbones)
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    init_default_scope('mmdet')
    torch.manual_seed(0)
    backbone = MODELS.build(dict(BACKBONES[name])).train()
    backbone.init_weights()
    for m in backbone.modules():  # train mode without randomness: eager vs compiled
        for attr in ('p', 'drop_prob'):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    x = torch.randn(2, 3, 40, 56, requires_grad=True)

    def step(fn):
        torch.manual_seed(1)  # the same draws (VECA samples its cores in training)
        out = fn(x)
        (grad,) = torch.autograd.grad(sum(o.square().sum() for o in out), x)
        return out, grad

    ref, ref_grad = step(backbone)
    out, grad = step(torch.compile(backbone, backend='aot_eager', fullgraph=True))
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)


#: CASwin left out: mmdet's shifted windows with symbolic sizes did not finish compiling
#: in 4 minutes; CAPVT-zero takes a minute (the same operator as CAPVT's)
DYNAMIC = ['CAPVT', 'CorePVT', 'CADeiT', 'VECAViT']


@pytest.mark.parametrize('name', DYNAMIC)
def test_backbone_compiles_whole_with_dynamic_shapes(name):
    """One dynamic-shape graph (fullgraph=True, dynamic=True) serves inputs of other
    sizes, each equal to eager: detection and segmentation batches vary in size."""
    import mmcirc  # noqa: F401  (registers the backbones)
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    init_default_scope('mmdet')
    torch.manual_seed(0)
    backbone = MODELS.build(dict(BACKBONES[name])).eval()
    backbone.init_weights()
    compiled = torch.compile(backbone, backend='aot_eager', fullgraph=True, dynamic=True)
    with torch.no_grad():
        for hw in ((64, 96), (96, 64)):
            x = torch.randn(1, 3, *hw)
            for o, r in zip(compiled(x), backbone(x)):
                torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
