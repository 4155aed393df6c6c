"""timm's fx feature extraction (``features_only=True, feature_cls='fx'``) and
torchvision's ``create_feature_extractor`` on the ``feature_info`` modules: the maps of
the default feature model (``'getter'``, ``forward_intermediates``), one model per
family, small."""

import pytest
import timm
import torch
from timm.models import get_graph_node_names, get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import create_feature_extractor

from mmcirc.timm.model import FeatureGraph

#: one model per family (tests/timm/timm_variants.py sizes)
FAMILIES = ['ca_pvt_tiny', 'ca_swin_tiny', 'core_pvt_tiny', 'core_swin_tiny', 'ca_deit_tiny']
FAMILIES += ['veca_small']
#: not multiples of the patch size nor of the pyramid strides (padding on the way)
SIZE = (1, 3, 40, 52)


def _maps(model, x):
    with torch.no_grad():
        return model(x)


def _assert_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('name', FAMILIES)
def test_fx_features_equal_the_getters(small, name):
    fx = small(name, features_only=True, feature_cls='fx')
    assert isinstance(fx, FeatureGraph)
    x = torch.randn(SIZE)
    _assert_equal(_maps(fx, x), _maps(small(name, features_only=True), x))


@pytest.mark.parametrize('name', FAMILIES)
def test_fx_features_of_chosen_out_indices_equal_the_getters(small, name):
    fx = small(name, features_only=True, feature_cls='fx', out_indices=(-1, 0))
    getter = small(name, features_only=True, out_indices=(-1, 0))
    assert fx.feature_info.module_name() == getter.feature_info.module_name()
    x = torch.randn(SIZE)
    _assert_equal(_maps(fx, x), _maps(getter, x))


@pytest.mark.parametrize('name', ['ca_pvt_tiny', 'ca_deit_tiny'])
def test_an_fx_feature_graph_serves_other_input_sizes(small, name):
    """The graph holds no traced size: a second size gives the getter's maps too."""
    fx, getter = small(name, features_only=True, feature_cls='fx'), small(name, features_only=True)
    x = torch.randn(2, 3, 64, 48)
    _assert_equal(_maps(fx, x), _maps(getter, x))


@pytest.mark.parametrize('name', FAMILIES)
def test_torchvision_extractor_on_the_feature_info_modules(small, name):
    """With timm's leaves: a pyramid stage's node is its output map; a block's node its
    tokens, which ``feature_map_fn`` makes the map (None: the node is the map)."""
    model = small(name)
    leaves = {'leaf_modules': get_notrace_modules(), 'autowrap_functions': get_notrace_functions()}
    nodes = [i['module'] for i in model.feature_info]
    extractor = create_feature_extractor(model, nodes, tracer_kwargs=leaves).eval()
    x = torch.randn(SIZE)
    to_map = model.feature_map_fn() or (lambda out, _: out)
    got = [to_map(out, x) for out in _maps(extractor, x).values()]
    with torch.no_grad():
        want = model.forward_intermediates(x, intermediates_only=True)
    _assert_equal(got, want)


def test_fx_trace_keeps_the_backbone_out_of_the_leaves(small):
    """The stages and blocks are traced through: their submodules are graph nodes."""
    train, _ = get_graph_node_names(small('ca_swin_tiny'))
    assert any(n.startswith('backbone.stages.0.blocks.0.') for n in train)
    assert 'backbone' not in train


def test_a_model_with_grad_checkpointing_traces(small):
    """The graph holds the blocks themselves (no checkpoint), the model's logits."""
    model = small('ca_pvt_tiny')
    model.set_grad_checkpointing(True)
    graph = timm.models.create_feature_extractor(model, ['head']).eval()
    x = torch.randn(SIZE)
    _assert_equal(list(_maps(graph, x).values()), [_maps(model, x)])


def test_hook_features_are_refused_naming_the_allowed_classes():
    with pytest.raises(ValueError, match="feature_cls must be 'getter' or 'fx'"):
        timm.create_model('ca_deit_tiny', features_only=True, feature_cls='hook')
