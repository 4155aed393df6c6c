"""SimpleFeaturePyramid (ViTDet's simple feature pyramid): levels, strides, channels,
and each level built from the stride-16 map by the layers the ViTDet paper names."""

import pytest
import torch
import torch.nn.functional as F

from mmcirc.models.necks import SimpleFeaturePyramid


def test_levels_and_shapes():
    neck = SimpleFeaturePyramid(in_channels=[32], out_channels=8, num_outs=5).eval()
    x = torch.randn(2, 32, 6, 10)  # stride 16 of a 96 x 160 image
    with torch.no_grad():
        outs = neck((x,))
    assert [tuple(o.shape) for o in outs] == [
        (2, 8, 24, 40),
        (2, 8, 12, 20),
        (2, 8, 6, 10),
        (2, 8, 3, 5),
        (2, 8, 2, 3),
    ]


def test_identity_level_is_two_convs_with_channel_norms():
    """The x1 level is conv1x1 -> LN(C) -> conv3x3 -> LN(C), written here with F."""
    torch.manual_seed(0)
    neck = SimpleFeaturePyramid(
        in_channels=16, out_channels=8, scale_factors=(1.0,), num_outs=1
    ).eval()
    x = torch.randn(1, 16, 5, 7)
    c1, n1, c3, n3 = neck.stages[0]

    def ln(t, norm):  # layer norm over channels, per position
        return F.layer_norm(
            t.permute(0, 2, 3, 1), (t.shape[1],), norm.weight, norm.bias, 1e-6
        ).permute(0, 3, 1, 2)

    ref = ln(F.conv2d(ln(F.conv2d(x, c1.weight), n1), c3.weight, padding=1), n3)
    with torch.no_grad():
        out = neck(x)[0]
    torch.testing.assert_close(out, ref)


def test_p6_is_strided_subsample_of_p5():
    neck = SimpleFeaturePyramid(in_channels=16, out_channels=8, num_outs=5).eval()
    with torch.no_grad():
        outs = neck(torch.randn(1, 16, 8, 8))
    torch.testing.assert_close(outs[4], outs[3][..., ::2, ::2])


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(in_channels=16, scale_factors=(3.0,)), 'scale_factors must be taken from'),
        (dict(in_channels=16, num_outs=2), 'num_outs must be an int >= 4'),
        (dict(in_channels=0), 'in_channels must be a positive int'),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=None) as err:
        SimpleFeaturePyramid(**kwargs)
    assert message in str(err.value)
