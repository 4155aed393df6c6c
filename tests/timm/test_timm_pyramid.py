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


def test_classifier_refuses_stages_it_does_not_output(small):
    model = small('ca_pvt_tiny')
    with pytest.raises(ValueError, match='features_only=True'):
        model.forward_intermediates(torch.randn(1, 3, 64, 64), indices=(0, 3))


def test_features_model_gives_the_last_map_only_when_it_outputs_it(small):
    x = torch.randn(1, 3, 64, 64)
    feats = small('ca_pvt_tiny', features_only=True, out_indices=(1, 3)).model
    ref = _backbone_like(feats, CAPVT, out_indices=(1, 3)).eval()
    with torch.no_grad():
        last, inter = feats.forward_intermediates(x, indices=(1,))
        want = ref(x)
    torch.testing.assert_close(last, want[1])
    torch.testing.assert_close(inter[0], want[0])
    early = small('ca_pvt_tiny', features_only=True, out_indices=(0, 1)).model
    with pytest.raises(ValueError, match='intermediates_only=False needs the last stage'):
        early.forward_intermediates(x, indices=(0,))
    assert len(early.forward_intermediates(x, indices=(0,), intermediates_only=True)) == 1


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
