"""The registered pyramid blocks: declarations, mmdet wrappers, block configs."""

import pytest
import torch
from mmdet.models.backbones.pvt import PVTEncoderLayer
from mmdet.models.backbones.swin import SwinBlock

from mmcirc.models.backbones import CAPVT, CASwin
from mmcirc.models.blocks import (
    CirculantBlock,
    CoreBlock,
    SRABlock,
    WindowBlock,
)
from mmcirc.registry import model_registries

TINY = dict(embed_dims=[8, 16, 24, 32], depths=[1, 2, 1, 1], num_heads=[1, 2, 2, 4])


def test_blocks_are_registered_in_all_three_libraries():
    for cls in (CirculantBlock, CoreBlock, SRABlock, WindowBlock):
        assert all(r.get(cls.__name__) is cls for r in model_registries())
    assert CAPVT.attention_choices() == ('circulant', 'core', 'sra')
    assert CASwin.attention_choices() == ('circulant', 'core', 'window')
    assert [CAPVT.attention_blocks[k].kind for k in CAPVT.attention_choices()] == [
        'circulant',
        'core',
        'sra',
    ]
    assert [c.carries_cores for c in (CirculantBlock, CoreBlock, SRABlock, WindowBlock)] == [
        False,
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    'wrapper,original,kwargs',
    [
        (
            SRABlock,
            PVTEncoderLayer,
            dict(embed_dims=16, num_heads=2, feedforward_channels=32, sr_ratio=2),
        ),
        (
            WindowBlock,
            SwinBlock,
            dict(embed_dims=16, num_heads=2, feedforward_channels=32, window_size=3, shift=True),
        ),
    ],
)
def test_wrappers_are_mmdets_blocks(wrapper, original, kwargs):
    torch.manual_seed(0)
    ours = wrapper(**kwargs).eval()
    torch.manual_seed(0)
    ref = original(**kwargs).eval()
    assert isinstance(ours, original) and list(ours.state_dict()) == list(ref.state_dict())
    assert ours.added_state_keys() == []
    x = torch.randn(2, 7 * 5, 16)
    torch.testing.assert_close(ours(x, (7, 5)), ref(x, (7, 5)), rtol=0, atol=0)


def test_added_keys_are_the_new_attention_and_cpe():
    block = CirculantBlock(8, 16)
    assert sorted({k.split('.')[0] for k in block.added_state_keys()}) == ['attn', 'cpe']
    core = CoreBlock(8, 2, 16, use_cpe=False)
    assert {k.split('.')[0] for k in core.added_state_keys()} == {'attn'}


def test_block_cfgs_set_per_stage_options():
    model = CASwin(
        arch=TINY,
        stage_attentions='circulant',
        block_cfgs=[dict(type='CirculantBlock', boundary='zero'), None, dict(scale='n'), None],
    )
    attns = [[b.attn for b in s.blocks] for s in model.stages]
    assert [a.boundary for a in attns[0]] == ['zero'] and all(
        a.boundary == 'circular' for a in attns[1]
    )
    assert [a.scale for a in attns[2]] == ['n'] and attns[3][0].scale == 'sqrt_n'


def test_block_cfgs_type_sets_the_kind():
    model = CAPVT(arch=TINY, num_cores_max=8, block_cfgs=[None, dict(type='CoreBlock'), None, None])
    assert model.stage_attentions == ('circulant', 'core', 'sra', 'sra')
    assert model.stages[1].cores is not None and model.stages[0].cores is None


@pytest.mark.parametrize(
    'kwargs,match',
    [
        (
            dict(
                stage_attentions='circulant', block_cfgs=[dict(type='CoreBlock'), None, None, None]
            ),
            r"block_cfgs\[0\] type 'CoreBlock' is 'core' attention but stage_attentions\[0\] is 'circulant'",
        ),
        (
            dict(block_cfgs=[dict(type='WindowBlock'), None, None, None]),
            r'block_cfgs\[0\]: block type must be',
        ),
        (dict(block_cfgs=[None, None]), 'block_cfgs must be a dict or a list of 4'),
    ],
)
def test_bad_block_cfgs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CAPVT(arch=TINY, **kwargs)


def test_public_stages_keep_the_checkpoint_keys():
    pvt, swin = CAPVT(arch=TINY), CASwin(arch=TINY)
    assert pvt.stages is pvt.layers and 'stages' not in dict(pvt.named_children())
    assert swin.stages is swin._modules['stages']
    assert all(k.startswith(('layers.', 'norm')) for k in pvt.state_dict() if 'blocks' in k)
    assert any(k.startswith('stages.0.blocks.0.') for k in swin.state_dict())
    assert [s.attention for s in pvt.stages] == list(pvt.stage_attentions)


def test_sra_block_skips_the_weight_average_of_mmdets_layer():
    """SRABlock is mmdet's PVTEncoderLayer (bitwise: test_wrappers_are_mmdets_blocks) less
    the head-average of the attention weights that mmdet's SpatialReductionAttention
    drops; the same convolutions run."""
    kwargs = dict(embed_dims=16, num_heads=2, feedforward_channels=32, sr_ratio=2)
    x = torch.randn(2, 7 * 5, 16)

    def ops(block):
        with torch.no_grad(), torch.profiler.profile(record_shapes=True) as prof:
            block.eval()(x, (7, 5))
        events = prof.key_averages(group_by_input_shape=True)
        convs = sorted(tuple(e.input_shapes[1]) for e in events if e.key == 'aten::conv2d')
        return convs, any(e.key == 'aten::mean' for e in events)

    convs = sorted([(16, 16, 2, 2), (32, 16, 1, 1), (16, 32, 1, 1)])
    assert ops(PVTEncoderLayer(**kwargs)) == (convs, True)
    assert ops(SRABlock(**kwargs)) == (convs, False)
