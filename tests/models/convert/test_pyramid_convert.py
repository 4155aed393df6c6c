"""What the pyramid families share (mmcirc.models.convert.pyramid): building
the target, errors that name the tensor and the archs that fit, output names, the saved
file, on the fakes of tests/checkpoint_fakes.py."""

import pytest
import torch

from checkpoint_fakes import (
    PVT_ARCH,
    PVT_IMG,
    SWIN_ARCH,
    capvt,
    caswin,
    official_cadeit,
    official_pvt,
    official_swin,
    replaced_params,
)
from mmcirc.engine import load_from_local
from mmcirc.models.backbones import CAPVT, CoreSwin
from mmcirc.models.convert.pyramid import convert_pyramid, default_output_path
from mmcirc.models.convert.pyramid_target import build_backbone, replaced_attention_keys
from mmcirc.models.convert import ConversionError, save_checkpoint


def test_arch_mismatch_errors_name_tensor_and_shapes():
    deep = dict(PVT_ARCH, depths=(2, 2, 2, 2))
    with pytest.raises(
        ConversionError,
        match=r'depth mismatch: the checkpoint has depths \(1, 2, 1, 1\).*'
        r'target is CAPVT\(embed_dims=\(8, 16, 40, 64\), depths=\(2, 2, 2, 2\)',
    ):
        convert_pyramid(official_pvt(), CAPVT(arch=deep))
    wide = dict(PVT_ARCH, embed_dims=(16, 32, 40, 64))
    with pytest.raises(
        ConversionError,
        match=r'layers\.0\.patch_embed\.projection\.weight: checkpoint '
        r'\(8, 3, 4, 4\) vs model \(16, 3, 4, 4\)',
    ):
        convert_pyramid(official_pvt(), CAPVT(arch=wide, pretrain_img_size=PVT_IMG))
    with pytest.raises(ConversionError, match="use arch 'tiny'"):
        convert_pyramid(
            official_pvt(dict(PVT_ARCH, embed_dims=(64, 128, 320, 512), depths=(2, 2, 2, 2))),
            capvt(),
        )
    with pytest.raises(ConversionError, match='cannot recognise the PVT checkpoint layout'):
        convert_pyramid(official_swin(), capvt())
    with pytest.raises(ConversionError, match='cannot recognise the SWIN checkpoint layout'):
        convert_pyramid(official_pvt(), caswin())
    with pytest.raises(ConversionError, match='cannot recognise the SWIN checkpoint layout'):
        convert_pyramid(
            {'state_dict': convert_pyramid(official_pvt(), capvt()).state_dict}, caswin()
        )
    with pytest.raises(ConversionError, match='no SWIN stage blocks.*use cadeit_to_mmcirc.py'):
        convert_pyramid(official_cadeit(16, 1), caswin())
    with pytest.raises(ConversionError, match='mmpretrain and mmseg have no PVT v1'):
        convert_pyramid(official_pvt(), capvt(), src_layout='mmpretrain')


def test_saved_checkpoint_loads_through_init_cfg(tmp_path):
    res = convert_pyramid(official_pvt(), capvt(), meta={'source': 'fake.pth'})
    path = save_checkpoint(res, str(tmp_path / 'sub' / 'ca_pvt_x.pth'))
    assert [p.name for p in (tmp_path / 'sub').iterdir()] == ['ca_pvt_x.pth']  # no temp file left
    ckpt = load_from_local(path, map_location=None)
    assert set(ckpt) == {'state_dict', 'meta'} and ckpt['meta']['source'] == 'fake.pth'
    assert ckpt['meta']['new'] == res.new and ckpt['meta']['model']['type'] == 'CAPVT'
    model = capvt(init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    for k, v in res.state_dict.items():
        assert torch.equal(model.state_dict()[k], v), k


def test_build_and_default_output_names():
    pvt = build_backbone('pvt', arch='tiny')
    assert type(pvt) is CAPVT and pvt.depths == (2, 2, 2, 2)
    assert default_output_path(pvt, 'tiny') == 'work_dirs/pretrained/ca_pvt_t_in1k.pth'
    core = build_backbone('swin', arch=SWIN_ARCH, attention='core', num_cores_max=4)
    assert type(core) is CoreSwin
    assert default_output_path(core, SWIN_ARCH) == 'work_dirs/pretrained/core_swin_custom_in1k.pth'
    assert default_output_path(caswin(), 'tiny') == 'work_dirs/pretrained/ca_swin_t_in1k.pth'
    odd = build_backbone('swin', arch='tiny', stage_attentions=['circulant'] * 3 + ['window'])
    assert (
        default_output_path(odd, 'tiny', 'ca-deit-s')
        == 'work_dirs/pretrained/swin_t_circulant-circulant-circulant-window_ca-deit-s.pth'
    )
    with pytest.raises(ConversionError, match='cannot build the target CAPVT'):
        build_backbone('pvt', arch='huge')


@pytest.mark.parametrize('make', [capvt, caswin])
def test_replaced_attention_keys_are_the_replaced_modules(make):
    """The keys the blocks declare as added are those of their CPE / attention modules
    and the core banks (found by module type)."""
    model = make(stage_attentions=('core', 'circulant', 'circulant', 'core'), num_cores_max=4)
    assert set(replaced_attention_keys(model)) == replaced_params(model)
