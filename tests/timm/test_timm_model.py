"""timm's model interface of the isotropic models (CA-DeiT, VECA), checked against
the mmcirc backbones they wrap, run on their own (the mm-side modules, tested against
the official code in tests/models/backbones)."""

import pytest
import torch

from mmcirc.models.backbones import CADeiT, VECAViT


def _backbone_like(model, cls, **kwargs):
    """The mmcirc backbone with ``model``'s weights, built on its own (a features model
    has no final norm: pruned, as timm's features_only prunes it)."""
    ref = cls(arch=model.arch, patch_size=8, **kwargs).eval()
    missing, unexpected = ref.load_state_dict(
        {
            k[len('backbone.') :]: v
            for k, v in model.state_dict().items()
            if k.startswith('backbone.')
        },
        strict=False,
    )
    assert not unexpected and all(k.split('.')[0] in ('norm', 'final_norm') for k in missing)
    return ref


def test_cadeit_logits_are_the_official_head_on_the_pooled_feature(small):
    model = small('ca_deit_tiny', num_classes=5)
    ref = _backbone_like(model, CADeiT, out_type='avg_featmap')
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        feat = model.forward_features(x)  # (B, N, C)
        pooled = model.forward_head(feat, pre_logits=True)
        logits = model(x)
        want = ref(x)[-1]  # (B, C): mean of the final-LN tokens
    assert feat.shape == (2, 5 * 7, 16)
    torch.testing.assert_close(pooled, want)
    torch.testing.assert_close(logits, model.get_classifier()(want))


def test_veca_head_is_the_global_token(small):
    model = small('veca_small', num_classes=4, num_cores=8)
    ref = _backbone_like(model, VECAViT, num_cores=8, out_type='global_token')
    x = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        seq = model.forward_features(x)
        token = model.forward_head(seq, pre_logits=True)
        want = ref(x)[-1]
    assert seq.shape == (1, 8 + 3 * 5, 16) and model.num_prefix_tokens == 8
    torch.testing.assert_close(token, want)
    assert model(x).shape == (1, 4)


@pytest.mark.parametrize('name', ['ca_deit_tiny', 'veca_small'])
@pytest.mark.parametrize('size', [(17, 33), (64, 24)])
def test_any_input_size(small, name, size):
    model = small(name, num_classes=3, dynamic_img_size=True, img_size=size)
    with torch.no_grad():
        out = model(torch.randn(1, 3, *size))
    assert out.shape == (1, 3) and torch.isfinite(out).all()


def test_reset_classifier(small):
    model = small('ca_deit_tiny', num_classes=5)
    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), torch.nn.Identity) and model.num_classes == 0
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 16)  # the pooled feature
    model.reset_classifier(2, global_pool='')
    assert model.forward_head(torch.randn(1, 4, 16), pre_logits=True).shape == (1, 4, 16)
    with pytest.raises(ValueError, match='global_pool'):
        model.reset_classifier(2, global_pool='max')


def test_features_only_blocks_equal_the_backbone_maps(small):
    feats = small('ca_deit_tiny', features_only=True, out_indices=(0, 1))
    assert feats.feature_info.channels() == [16, 16] and feats.feature_info.reduction() == [8, 8]
    ref = _backbone_like(feats.model, CADeiT, out_indices=(0, 1), final_norm=False)
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        maps = feats(x)
        want = ref(x)  # (B, C, H/8, W/8) raw block outputs
    assert [m.shape for m in maps] == [(1, 16, 4, 6)] * 2
    for m, w in zip(maps, want):
        torch.testing.assert_close(m, w)


def test_veca_features_only_are_the_patch_maps(small):
    feats = small('veca_small', features_only=True, out_indices=2, num_cores=8)
    ref = _backbone_like(feats.model, VECAViT, num_cores=8, out_indices=(0, 1), out_norm=False)
    x = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        maps, want = feats(x), ref(x)
    for m, w in zip(maps, want):
        torch.testing.assert_close(m, w)


@pytest.mark.parametrize(
    'name,cls,extra',
    [
        ('ca_deit_tiny', CADeiT, dict(final_norm=False)),
        ('veca_small', VECAViT, dict(num_cores=8, out_norm=False)),
    ],
)
def test_intermediates_as_tokens_with_the_final_features(small, name, cls, extra):
    """``output_fmt='NLC'``: the backbone's block maps as (B, N, C) tokens; the final
    features are those of ``forward_features``."""
    kwargs = dict(num_cores=8) if name == 'veca_small' else {}
    model = small(name, num_classes=3, **kwargs)
    ref = _backbone_like(model, cls, out_indices=(0, 1), **extra)
    x = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        final, tokens = model.forward_intermediates(x, indices=(0, 1), output_fmt='NLC')
        want = [m.flatten(2).transpose(1, 2) for m in ref(x)]  # (B, C, H', W') -> (B, N, C)
        torch.testing.assert_close(final, model.forward_features(x))
    assert [t.shape for t in tokens] == [(1, 3 * 5, 16)] * 2
    for t, w in zip(tokens, want):
        torch.testing.assert_close(t, w)


@pytest.mark.parametrize('name', ['ca_deit_tiny', 'veca_small'])
def test_intermediates_refuse_an_unknown_output_fmt(small, name):
    model = small(name, num_classes=3)
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NLC', got 'NHWC'"):
        model.forward_intermediates(torch.randn(1, 3, 16, 16), output_fmt='NHWC')


def block_calls(model, block):
    """Calls of the block's layers in a training step (checkpointing runs them again
    in the backward)."""
    calls = []
    for layer in block.children():
        layer.register_forward_hook(lambda *_: calls.append(1))
    model.train()
    model(torch.randn(2, 3, 24, 24)).sum().backward()
    return len(calls)


@pytest.mark.parametrize('name', ['ca_deit_tiny', 'veca_small'])
def test_grad_checkpointing_recomputes_the_blocks_with_the_same_gradients(small, name):
    grads, calls = [], []
    for enable in (False, True):
        model = small(name, num_classes=3)
        model.set_grad_checkpointing(enable)
        calls.append(block_calls(model, model.backbone.blocks[0]))
        grads.append(next(model.backbone.blocks[0].parameters()).grad)
    assert calls[1] > calls[0] > 0  # the block's layers run again in the backward
    torch.testing.assert_close(grads[0], grads[1])


def test_veca_core_tokens_without_weight_decay(small):
    from timm.optim import create_optimizer_v2

    model = small('veca_small')
    assert model.no_weight_decay() == {
        'backbone.cores',
        'backbone.core_coords',
        'backbone.pos_alpha',
    }
    opt = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05)
    decay = {id(p): g['weight_decay'] for g in opt.param_groups for p in g['params']}
    assert decay[id(model.backbone.cores)] == 0 and decay[id(model.backbone.core_coords)] == 0
    assert decay[id(model.backbone.blocks[0].fc1.weight)] == 0.05


@pytest.mark.parametrize('name', ['ca_deit_tiny', 'veca_small', 'ca_pvt_tiny', 'ca_swin_tiny'])
def test_layer_decay_orders_the_groups_from_stem_to_head(small, name):
    """timm's layer-wise decay (group_matcher): every parameter in a group, learning
    rates rising from the stem through the blocks to the classifier."""
    from timm.optim import create_optimizer_v2

    model = small(name, num_classes=3)
    opt = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    scale = {id(p): g['lr_scale'] for g in opt.param_groups for p in g['params']}
    named = dict(model.named_parameters())
    assert set(scale) == {id(p) for p in named.values()}
    path = ('backbone.patch_embed', 'backbone.blocks', 'backbone.layers', 'backbone.stages', 'head')
    order = [scale[id(p)] for n, p in named.items() if n.startswith(path)]  # stem to head
    assert order == sorted(order) and order[0] < order[-1] == 1.0
    stem = [n for n in named if 'patch_embed' in n][0]
    assert scale[id(named[stem])] == min(scale.values())


@pytest.mark.parametrize(
    'name,where',
    [
        ('ca_deit_tiny', lambda m: m.backbone.blocks[0].mlp.drop.p),
        ('veca_small', lambda m: m.backbone.blocks[0].drop.p),
        ('ca_pvt_tiny', lambda m: m.backbone.layers[0].pos_embed.drop.p),
    ],
)
def test_timm_dropout_names(small, name, where):
    """timm's ``drop_rate`` is the head dropout, ``proj_drop_rate`` the backbone's."""
    model = small(name, num_classes=2, drop_rate=0.25, proj_drop_rate=0.125)
    assert model.head_drop.p == 0.25 and where(model) == 0.125
