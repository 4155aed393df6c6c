"""PVT v1 checkpoints for CA-PVT / Core-PVT (mmcirc.models.convert.pvt) on the
fake official and mmdet checkpoints of tests/checkpoint_fakes.py."""

import re

import pytest
import torch
import torch.nn.functional as F
from mmdet.models.backbones.pvt import pvt_convert

from checkpoint_fakes import PVT_ARCH, PVT_IMG, capvt, mmdet_pvt, official_pvt, replaced_params
from mmcirc.models.backbones import CAPVT, CorePVT
from mmcirc.models.convert.pvt import LAYOUTS, convert_mmdet_pvt_keys
from mmcirc.models.convert.pyramid import convert_pyramid, detect_layout
from mmcirc.models.convert import ConversionError, format_summary


def test_fake_official_pvt_is_what_mmdet_reads():
    """The hand-written official layout is complete: mmdet's converter + model take it strictly."""
    mmdet_pvt().load_state_dict(pvt_convert(official_pvt()), strict=True)


def test_pvt_official_to_capvt():
    src = official_pvt()
    model = capvt()
    res = convert_pyramid({'model': dict(src)}, model)
    out = res.state_dict
    assert res.source_layout == 'official'
    # the right tensors arrive unchanged at the right keys
    assert torch.equal(
        out['layers.0.patch_embed.projection.weight'], src['patch_embed1.proj.weight']
    )
    assert torch.equal(out['layers.1.patch_embed.norm.bias'], src['patch_embed2.norm.bias'])
    assert torch.equal(out['layers.0.pos_embed.pos_embed'], src['pos_embed1'])
    assert torch.equal(
        out['layers.3.pos_embed.pos_embed'], src['pos_embed4'][:, 1:]
    )  # cls token out
    c = 40
    w = out['layers.2.blocks.0.attn.attn.in_proj_weight']
    assert torch.equal(w[:c], src['block3.0.attn.q.weight'])
    assert torch.equal(w[c:], src['block3.0.attn.kv.weight'])
    assert torch.equal(
        out['layers.2.blocks.0.attn.attn.in_proj_bias'][:c], src['block3.0.attn.q.bias']
    )
    assert torch.equal(
        out['layers.2.blocks.0.attn.attn.out_proj.weight'], src['block3.0.attn.proj.weight']
    )
    assert torch.equal(out['layers.2.blocks.0.attn.sr.weight'], src['block3.0.attn.sr.weight'])
    assert torch.equal(out['layers.2.blocks.0.attn.norm.weight'], src['block3.0.attn.norm.weight'])
    # circulant stages keep their norms and MLP
    assert torch.equal(out['layers.1.blocks.1.norm1.weight'], src['block2.1.norm1.weight'])
    assert torch.equal(
        out['layers.0.blocks.0.ffn.layers.0.weight'][:, :, 0, 0], src['block1.0.mlp.fc1.weight']
    )
    assert torch.equal(out['layers.1.blocks.1.ffn.layers.3.bias'], src['block2.1.mlp.fc2.bias'])
    assert res.sources['layers.2.blocks.0.attn.attn.in_proj_weight'] == [
        'block3.0.attn.q.weight',
        'block3.0.attn.kv.weight',
    ]

    # what is new is exactly the circulant attention and CPE of stages 1-2
    expected_new = replaced_params(model)
    assert expected_new and all(k.startswith(('layers.0.', 'layers.1.')) for k in expected_new)
    fresh = capvt()
    missing, unexpected = fresh.load_state_dict(out, strict=False)
    assert set(missing) == expected_new and unexpected == []
    assert set(res.new_attention) == expected_new and res.new_other == []
    # unused: stage 1-2 attention (q, kv, proj, sr, norm), final norm, cls token, head
    expected_unused = {k for k in src if re.match(r'^block[12]\.\d+\.attn\.', k)}
    expected_unused |= {'norm.weight', 'norm.bias', 'cls_token', 'head.weight', 'head.bias'}
    assert set(res.unused) == expected_unused
    assert len(res.loaded) + len(res.new) == len(fresh.state_dict())
    with torch.no_grad():
        assert [o.shape[1] for o in fresh.eval()(torch.randn(1, 3, 40, 56))] == [8, 16, 40, 64]
    summary = format_summary(res, 'test')
    assert (
        f'loaded: {len(res.loaded)} tensors' in summary and 'block*.*.attn.q.weight (x3)' in summary
    )
    assert 'block1.0.attn.q.weight' in format_summary(res, 'test', verbose=True)


def test_pvt_mmdet_layout_gives_the_same_checkpoint():
    src = official_pvt()
    direct = convert_pyramid(src, capvt())
    det = mmdet_pvt()
    det.load_state_dict(pvt_convert(src), strict=True)
    detector = {
        'state_dict': {
            **{'backbone.' + k: v for k, v in det.state_dict().items()},
            'neck.conv.weight': torch.zeros(3),
            'bbox_head.cls.bias': torch.zeros(2),
        },
        'meta': {'epoch': 12},
    }
    via_mmdet = convert_pyramid(detector, capvt())
    assert via_mmdet.source_layout == 'mmdet'
    assert list(via_mmdet.state_dict) == list(direct.state_dict)
    for k, v in direct.state_dict.items():
        assert torch.equal(via_mmdet.state_dict[k], v), k
    assert set(via_mmdet.new) == set(direct.new)
    assert {'neck.conv.weight', 'bbox_head.cls.bias'} <= set(via_mmdet.unused)
    # an mmcirc checkpoint converts to itself
    again = convert_pyramid({'state_dict': direct.state_dict}, capvt())
    assert again.source_layout == 'mmcirc' and again.loaded == direct.loaded and again.unused == []


@pytest.mark.parametrize(
    'kinds', [('core', 'core', 'sra', 'sra'), ('circulant', 'core', 'circulant', 'sra')]
)
def test_pvt_other_stage_layouts(kinds):
    src = official_pvt()
    model = CorePVT(
        arch=PVT_ARCH, pretrain_img_size=PVT_IMG, stage_attentions=kinds, num_cores_max=4
    )
    res = convert_pyramid(src, model)
    missing, unexpected = type(model)(
        arch=PVT_ARCH, pretrain_img_size=PVT_IMG, stage_attentions=kinds, num_cores_max=4
    ).load_state_dict(res.state_dict, strict=False)
    assert set(missing) == replaced_params(model) and unexpected == []
    replaced = [i + 1 for i, k in enumerate(kinds) if k != 'sra']
    assert set(res.unused) - {
        'norm.weight',
        'norm.bias',
        'cls_token',
        'head.weight',
        'head.bias',
    } == {k for k in src if re.match(rf'^block[{"".join(map(str, replaced))}]\.\d+\.attn\.', k)}
    if kinds[0] == 'core':
        assert 'layers.0.cores' in res.new_attention
    assert torch.equal(
        res.state_dict['layers.2.blocks.0.ffn.layers.0.bias'], src['block3.0.mlp.fc1.bias']
    )


def test_pvt_position_tables_of_another_size():
    src = official_pvt()
    model = CAPVT(arch=PVT_ARCH, pretrain_img_size=320)
    with pytest.raises(
        ConversionError,
        match=r'layers\.0\.pos_embed\.pos_embed: checkpoint \(1, 3136, 8\) '
        r'vs model \(1, 6400, 8\)[\s\S]*resize_pos_embed=True',
    ):
        convert_pyramid(src, model)
    res = convert_pyramid(src, model, resize_pos_embed=True)
    assert len(res.resized) == 4
    grid = src['pos_embed1'].reshape(1, 56, 56, 8).permute(0, 3, 1, 2)
    ref = F.interpolate(grid, size=(80, 80), mode='bilinear').flatten(2).transpose(1, 2)
    torch.testing.assert_close(res.state_dict['layers.0.pos_embed.pos_embed'], ref)


def test_layouts_detected_from_keys():
    """Each layout is told by its own keys: official (whai362), mmdet's model, ours."""
    det = mmdet_pvt().state_dict()
    ours = capvt().state_dict()
    assert detect_layout('pvt', official_pvt()) == 'official'
    assert detect_layout('pvt', det) == 'mmdet'
    assert detect_layout('pvt', ours) == 'mmcirc'
    assert set(LAYOUTS) == {'official', 'mmdet', 'mmcirc'}


def test_mmdet_key_map_loads_mmdet_weights_into_capvt():
    """mmdet's PyramidVisionTransformer state dict, renamed, fills every CAPVT tensor of
    the SRA stages of an all-SRA model strictly (the map, checked against mmdet's model)."""
    det = mmdet_pvt()
    ours = CAPVT(arch=PVT_ARCH, pretrain_img_size=PVT_IMG, stage_attentions='sra')
    ours.load_state_dict(convert_mmdet_pvt_keys(det.state_dict()), strict=True)
    assert torch.equal(
        ours.state_dict()['layers.2.blocks.0.attn.attn.in_proj_weight'],
        det.state_dict()['layers.2.1.1.attn.attn.in_proj_weight'],
    )
