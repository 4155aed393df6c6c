"""The CA/Core pyramids as timm models: features_only maps equal the mmcirc backbone's
(built on its own, as mmdet builds it), the classifier checkpoint into a feature model."""

import pytest
import torch

from mmcirc.models.backbones import CAPVT, CASwin, CorePVT


def _backbone_like(model, cls, **kwargs):
    ref = cls(arch=model.arch, **kwargs).eval()
    ref.load_state_dict(
        {
            k[len('backbone.') :]: v
            for k, v in model.state_dict().items()
            if k.startswith('backbone.')
        }
    )
    return ref


@pytest.mark.parametrize(
    'name,cls,extra',
    [
        ('ca_pvt_tiny', CAPVT, {}),
        ('core_pvt_tiny', CorePVT, dict(num_cores_max=8)),
        ('ca_swin_tiny', CASwin, dict(window_size=2)),
    ],
)
def test_features_only_maps_equal_the_backbone(small, name, cls, extra):
    feats = small(name, features_only=True, out_indices=(0, 1, 2, 3))
    assert feats.feature_info.reduction() == [4, 8, 16, 32]
    ref = _backbone_like(feats.model, cls, out_indices=(0, 1, 2, 3), **extra)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        maps, want = feats(x), ref(x)
    assert [m.shape[1] for m in maps] == feats.feature_info.channels()
    assert [m.shape[-2:] for m in maps] == [(16, 24), (8, 12), (4, 6), (2, 3)]
    for m, w in zip(maps, want):
        torch.testing.assert_close(m, w)


@pytest.mark.parametrize(
    'name,kwargs,reduction',
    [
        ('ca_pvt_tiny', dict(patch_sizes=2), [2, 4, 8, 16]),
        ('ca_swin_tiny', dict(strides=(2, 2, 2, 1)), [2, 4, 8, 8]),
    ],
)
def test_feature_reduction_follows_the_stride_arguments(small, name, kwargs, reduction):
    """timm's ``reduction`` of each stage is the input side over the map's (a real forward)."""
    feats = small(name, features_only=True, out_indices=(0, 1, 2, 3), **kwargs)
    with torch.no_grad():
        maps = feats(torch.randn(1, 3, 64, 64))
    assert [64 // m.shape[-1] for m in maps] == reduction
    assert feats.feature_info.reduction() == reduction


def test_classifier_checkpoint_into_swin_features(tmp_path, small):
    """The classifier has the last output LN only (norm3); the feature model's other
    output LNs start at their init (LN weight 1, bias 0), the rest is loaded."""
    source = small('ca_swin_tiny', num_classes=4)
    path = str(tmp_path / 'cls.pth')
    torch.save({'state_dict': source.state_dict()}, path)
    feats = small(
        'ca_swin_tiny',
        features_only=True,
        out_indices=(1, 3),
        pretrained=True,
        pretrained_cfg_overlay=dict(file=path),
    )
    bb, src = feats.model.backbone, source.backbone
    torch.testing.assert_close(bb.norm3.weight, src.norm3.weight)
    assert torch.equal(bb.norm1.weight, torch.ones_like(bb.norm1.weight))
    torch.testing.assert_close(
        bb.stages[1].blocks[0].norm1.weight, src.stages[1].blocks[0].norm1.weight
    )


@pytest.mark.parametrize(
    'name,cls,extra',
    [('ca_pvt_tiny', CAPVT, {}), ('core_pvt_tiny', CorePVT, dict(num_cores_max=8))],
)
def test_classifier_gives_every_stage_as_the_backbone(small, name, cls, extra):
    """A classifier's intermediates are the maps of the backbone built as mmdet builds
    it, with every stage an output (PVT: no output LNs)."""
    model = small(name, num_classes=3)
    ref = _backbone_like(model, cls, out_indices=(0, 1, 2, 3), **extra)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, indices=(0, 2, 3))
        want = ref(x)
    torch.testing.assert_close(final, want[3])
    for m, w in zip(inter, (want[0], want[2], want[3])):
        torch.testing.assert_close(m, w)


def test_swin_classifier_stages_take_the_output_ln_it_has(small):
    """CA-Swin's classifier has the last stage's output LN only (norm3): its other stage
    maps are the raw stage outputs, those of a backbone built without their LNs."""
    model = small('ca_swin_tiny', num_classes=3)
    assert [hasattr(model.backbone, f'norm{i}') for i in range(4)] == [False] * 3 + [True]
    ref = _backbone_like(model, CASwin, out_indices=(3,), window_size=2)
    x = torch.randn(1, 3, 64, 64)
    ref.out_indices = (0, 1, 2, 3)  # the stages without an LN come out raw
    with torch.no_grad():
        inter = model.forward_intermediates(x, intermediates_only=True)
        want = ref(x)
    for m, w in zip(inter, want):
        torch.testing.assert_close(m, w)


def test_features_model_gives_every_stage(small):
    x = torch.randn(1, 3, 64, 64)
    feats = small('ca_pvt_tiny', features_only=True, out_indices=(1, 3)).model
    ref = _backbone_like(feats, CAPVT, out_indices=(0, 1, 2, 3)).eval()
    with torch.no_grad():
        last, inter = feats.forward_intermediates(x, indices=(1,))
        want = ref(x)
    torch.testing.assert_close(last, want[3])
    torch.testing.assert_close(inter[0], want[1])


def test_grad_checkpointing_reaches_every_stage(small):
    model = small('core_swin_tiny', num_classes=2)
    model.set_grad_checkpointing(True)
    assert all(stage.with_cp for stage in model.backbone.stages)
    calls = []
    for layer in model.backbone.stages[0].blocks[0].children():
        layer.register_forward_hook(lambda *_: calls.append(1))
    model.train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    model.set_grad_checkpointing(False)
    once = len(calls)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert once > len(calls) - once > 0  # run again in the backward with checkpointing only


def test_no_weight_decay_names_the_core_banks_and_tables(small):
    assert small('core_pvt_tiny').no_weight_decay() == {
        'backbone.layers.0.cores',
        'backbone.layers.1.cores',
        *(f'backbone.layers.{i}.pos_embed.pos_embed' for i in range(4)),
    }
    names = small('ca_swin_tiny').no_weight_decay()
    assert names == {
        f'backbone.stages.{i}.blocks.0.attn.w_msa.relative_position_bias_table' for i in (2, 3)
    }


@pytest.mark.parametrize('name', ['ca_pvt_tiny', 'core_pvt_small'])
def test_min_input_size_of_the_config_is_the_backbone_minimum(name):
    """The registered config's ``min_input_size`` is the smallest image PVT's
    spatial-reduction stages take (the backbone's own ``min_input_size``)."""
    import timm

    model = timm.create_model(name, device='meta')
    side = model.backbone.min_input_size
    assert model.pretrained_cfg['min_input_size'] == (3, side, side)
    with pytest.raises(ValueError, match='below the minimum'):
        model(torch.randn(1, 3, side - 1, side - 1, device='meta'))


def test_concat_pooling_is_the_mean_and_max_of_the_last_map(small):
    model = small('ca_swin_tiny', num_classes=3, global_pool='catavgmax')
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feat = model.forward_features(x)
        pooled = model.forward_head(feat, pre_logits=True)
    want = torch.cat([feat.mean(dim=(2, 3)), feat.amax(dim=(2, 3))], dim=1)
    assert model.head_hidden_size == 2 * model.num_features == pooled.shape[1]
    torch.testing.assert_close(pooled, want)
