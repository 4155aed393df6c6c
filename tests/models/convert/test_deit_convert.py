"""CA-DeiT checkpoints (mmcirc.models.convert.deit): the released file for
CADeiT + LinearClsHead on the official-code fixture (tests/fixtures/official, see
make_official_fixtures.py; what is loaded, new and unused is compared with the official
state dict's own keys), and its blocks in the circulant stages of a pyramid on the fakes
of tests/checkpoint_fakes.py."""

import os.path as osp
import re

import pytest
import torch

from checkpoint_fakes import (
    PVT_ARCH,
    PVT_IMG,
    capvt,
    caswin,
    official_cadeit,
    official_swin,
    replaced_params,
)
from helpers import REPO
from mmcirc.models.backbones import CAPVT
from mmcirc.models.convert.deit import convert_cadeit, convert_cadeit_official
from mmcirc.models.convert.pyramid import convert_pyramid
from mmcirc.models.convert import CheckpointKindError, ConversionError

FIXTURES = osp.join(REPO, 'tests', 'fixtures', 'official')


def _fix(name):
    return torch.load(osp.join(FIXTURES, name), weights_only=True)


def test_cadeit_everything_loaded():
    fix = _fix('ca_deit_official.pth')
    src = fix['checkpoint']['model']
    result, model = convert_cadeit_official(fix['checkpoint'])
    assert result.new == [] and result.unused == []
    assert len(result.loaded) == len(src)
    for key, value in src.items():  # every official tensor, unchanged, under its new name
        new = 'head.fc.' + key[5:] if key.startswith('head.') else 'backbone.' + key
        assert torch.equal(result.state_dict[new], value), key
        assert result.sources[new] == [key]
    assert result.meta['arch'] == dict(embed_dims=48, depth=2, mlp_ratio=4.0)


def test_cadeit_named_arch_detected():
    from mmcirc.models.backbones import CADeiT

    with torch.device('meta'):
        sd = CADeiT(arch='small').state_dict()
    sd = {
        k: torch.zeros(v.shape)
        for k, v in sd.items()
        if 'blocks.' not in k or k.startswith('blocks.0.')
    }
    for k in list(sd):  # 12 blocks, but tiny tensors are enough for the detection: copy block 0
        if k.startswith('blocks.0.'):
            for i in range(1, 12):
                sd[k.replace('blocks.0.', f'blocks.{i}.')] = sd[k]
    result, model = convert_cadeit_official({'model': sd}, arch='small')
    assert result.meta['arch'] == 'small' and model.embed_dims == 384
    with pytest.raises(ConversionError, match="arch 'tiny' .* use arch 'small'"):
        convert_cadeit_official({'model': sd}, arch='tiny')


def test_cadeit_converter_refuses_veca():
    with pytest.raises(
        CheckpointKindError, match='this is a VECA checkpoint .*, not CA-DeiT'
    ) as err:
        convert_cadeit_official(_fix('veca_official.pth')['checkpoint'])
    assert err.value.found == 'veca'


def test_cadeit_missing_tensor():
    ckpt = _fix('ca_deit_official.pth')['checkpoint']
    del ckpt['model']['blocks.1.attn.proj.weight']
    with pytest.raises(ConversionError, match=r'lacks 1 tensor\(s\).*blocks.1.attn.proj.weight'):
        convert_cadeit_official(ckpt)


def test_cadeit_into_caswin_stage_of_its_width():
    src = official_cadeit(width=16, depth=3)['model']  # width 16 = stage 2 of SWIN_ARCH
    model = caswin()
    res = convert_cadeit({'model': src}, model)
    out = res.state_dict
    for j in range(2):  # CA-DeiT blocks 0, 1 -> stage 2 blocks 0, 1
        for ours, theirs in (
            ('cpe.weight', 'cpe.weight'),
            ('cpe.bias', 'cpe.bias'),
            ('attn.qkv.weight', 'attn.qkv.weight'),
            ('attn.gate.0.weight', 'attn.gate.0.weight'),
            ('attn.gate.0.bias', 'attn.gate.0.bias'),
            ('attn.proj.weight', 'attn.proj.weight'),
            ('norm1.bias', 'norm1.bias'),
            ('ffn.layers.0.0.weight', 'mlp.fc1.weight'),
            ('ffn.layers.1.weight', 'mlp.fc2.weight'),
        ):
            assert torch.equal(out[f'stages.1.blocks.{j}.{ours}'], src[f'blocks.{j}.{theirs}'])
    assert len(res.loaded) == 2 * 15
    assert {k for k in src if k.startswith('blocks.2.')} <= set(res.unused)
    assert {'patch_embed.proj.weight', 'norm.weight', 'head.weight'} <= set(res.unused)
    assert 'stages.0.blocks.0.attn.qkv.weight' in res.new_attention  # width 8: no CA-DeiT fits

    # on top of a Swin conversion, other blocks picked explicitly
    base = convert_pyramid(official_swin(), caswin())
    res = convert_cadeit(
        {'model': src}, caswin(), source_blocks=[2, 0], base={'state_dict': base.state_dict}
    )
    assert torch.equal(
        res.state_dict['stages.1.blocks.0.attn.qkv.weight'], src['blocks.2.attn.qkv.weight']
    )
    assert torch.equal(
        res.state_dict['stages.1.blocks.1.norm2.weight'], src['blocks.0.norm2.weight']
    )
    assert torch.equal(
        res.state_dict['stages.2.blocks.0.attn.w_msa.qkv.weight'],
        base.state_dict['stages.2.blocks.0.attn.w_msa.qkv.weight'],
    )
    assert set(res.new_attention) == {
        k for k in replaced_params(caswin()) if k.startswith('stages.0.')
    }


def test_cadeit_base_of_another_shape_is_refused_naming_the_tensor():
    src = official_cadeit(width=16, depth=3)['model']
    base = dict(caswin().state_dict())
    key = 'stages.2.blocks.0.attn.w_msa.qkv.weight'
    want = tuple(base[key].shape)
    base[key] = torch.zeros(want[0] + 1, want[1])
    with pytest.raises(
        ConversionError,
        match=rf'the base checkpoint does not fit CASwin\(.*\):\n  {re.escape(key)}: '
        rf'base \({want[0] + 1}, {want[1]}\) vs model \({want[0]}, {want[1]}\)',
    ):
        convert_cadeit({'model': src}, caswin(), base={'state_dict': base})


def test_cadeit_into_pvt_mixffn_and_no_fit():
    src = official_cadeit(width=40, depth=2)
    model = CAPVT(
        arch=PVT_ARCH,
        pretrain_img_size=PVT_IMG,
        stage_attentions=('sra', 'sra', 'circulant', 'sra'),
        mlp_ratios=4,
    )
    res = convert_cadeit(src, model)
    assert torch.equal(
        res.state_dict['layers.2.blocks.0.ffn.layers.0.weight'][:, :, 0, 0],
        src['model']['blocks.0.mlp.fc1.weight'],
    )
    assert torch.equal(
        res.state_dict['layers.2.blocks.0.attn.qkv.weight'],
        src['model']['blocks.0.attn.qkv.weight'],
    )
    with pytest.raises(
        ConversionError, match=r'no circulant block of width 40.*widths \{0: 8, 1: 16\}'
    ):
        convert_cadeit(src, capvt())
    with pytest.raises(ConversionError, match='not a CA-DeiT checkpoint'):
        convert_cadeit({'model': {'blocks.0.attn.qkv.weight': torch.zeros(3, 1)}}, capvt())
