"""Swin checkpoints for CA-Swin / Core-Swin (mmcirc.models.convert.swin) on the
fake official and mmdet checkpoints of tests/checkpoint_fakes.py."""

import re

import torch
import torch.nn.functional as F
from mmdet.models.backbones.swin import swin_converter

from checkpoint_fakes import SWIN_ARCH, WINDOW, caswin, mmdet_swin, official_swin, replaced_params
from mmcirc.models.backbones import CoreSwin
from mmcirc.models.convert.pyramid import convert_pyramid, detect_layout


def test_fake_official_swin_is_what_mmdet_reads():
    """The hand-written official layout is complete: mmdet's converter + model take it
    (only the per-stage output norms differ)."""
    swin = mmdet_swin()
    converted = {k[len('backbone.') :]: v for k, v in swin_converter(official_swin()).items()}
    missing, unexpected = swin.load_state_dict(converted, strict=False)
    assert set(missing) == {f'norm{i}.{p}' for i in range(4) for p in ('weight', 'bias')}
    assert set(unexpected) == {
        'norm.weight',
        'norm.bias',
        'stages.1.blocks.1.attn_mask',
        'stages.2.blocks.1.attn_mask',
    }


def test_swin_official_to_caswin():
    src = official_swin()
    model = caswin()
    res = convert_pyramid({'model': src}, model)
    out = res.state_dict
    assert res.source_layout == 'official'
    for key in ('relative_position_bias_table', 'qkv.weight', 'proj.bias'):
        assert torch.equal(
            out[f'stages.2.blocks.1.attn.w_msa.{key}'], src[f'layers.2.blocks.1.attn.{key}']
        )
    assert torch.equal(out['patch_embed.projection.weight'], src['patch_embed.proj.weight'])
    assert torch.equal(
        out['stages.0.blocks.0.ffn.layers.0.0.weight'], src['layers.0.blocks.0.mlp.fc1.weight']
    )
    assert torch.equal(
        out['stages.1.blocks.1.ffn.layers.1.bias'], src['layers.1.blocks.1.mlp.fc2.bias']
    )
    assert torch.equal(out['stages.1.blocks.0.norm2.weight'], src['layers.1.blocks.0.norm2.weight'])
    assert torch.equal(out['norm3.weight'], src['norm.weight'])  # the official final LN

    # patch merging: ours with the converted weights == the official merging
    fresh = caswin()
    missing, unexpected = fresh.load_state_dict(out, strict=False)
    x = torch.randn(2, 4 * 6, 16)
    with torch.no_grad():
        ours, _ = fresh.stages[1].downsample(x, (4, 6))
        g = x.view(2, 4, 6, 16)
        cat = torch.cat(
            [g[:, 0::2, 0::2], g[:, 1::2, 0::2], g[:, 0::2, 1::2], g[:, 1::2, 1::2]], -1
        )
        ref = (
            F.layer_norm(
                cat,
                (64,),
                src['layers.1.downsample.norm.weight'],
                src['layers.1.downsample.norm.bias'],
            )
            @ src['layers.1.downsample.reduction.weight'].T
        )
    torch.testing.assert_close(ours, ref.view(2, 6, 32), rtol=1e-5, atol=1e-5)

    # new: circulant attention + CPE of stages 1-2, and the output norms the classifier lacks
    expected_new = replaced_params(model)
    norms = {f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')}
    assert set(missing) == expected_new | norms and unexpected == []
    assert set(res.new_attention) == expected_new and set(res.new_other) == norms
    # unused: stage 1-2 window attention (bias tables, index buffers), masks, head
    expected_unused = {k for k in src if re.match(r'^layers\.[01]\.blocks\.\d+\.attn\.', k)}
    expected_unused |= {k for k in src if k.endswith('attn_mask')} | {'head.weight', 'head.bias'}
    assert set(res.unused) == expected_unused


def test_swin_mmdet_layout_gives_the_same_checkpoint():
    src = official_swin()
    direct = convert_pyramid(src, caswin())
    det = mmdet_swin()
    det.load_state_dict({k[9:]: v for k, v in swin_converter(src).items()}, strict=False)
    with torch.no_grad():
        det.norm3.weight.copy_(src['norm.weight'])
        det.norm3.bias.copy_(src['norm.bias'])
    sd = {
        'backbone.' + k: v
        for k, v in det.state_dict().items()
        if not k.startswith(('norm0', 'norm1', 'norm2'))
    }
    for layout in ('auto', 'mmpretrain'):
        res = convert_pyramid({'state_dict': sd}, caswin(), src_layout=layout)
        assert list(res.state_dict) == list(direct.state_dict)
        for k, v in direct.state_dict.items():
            assert torch.equal(res.state_dict[k], v), k


def test_core_swin_and_all_circulant_swin():
    src = official_swin()
    model = CoreSwin(arch=SWIN_ARCH, window_size=WINDOW, num_cores_max=4)
    res = convert_pyramid(src, model)
    assert {
        'stages.0.cores',
        'stages.1.blocks.0.cpe.weight',
        'stages.1.blocks.1.attn.q_core.weight',
    } <= set(res.new_attention)
    assert set(res.new_attention) == replaced_params(model)
    model = caswin(stage_attentions='circulant')
    res = convert_pyramid(src, model)
    assert not any('w_msa' in k for k in res.state_dict)
    assert {k for k in src if '.attn.relative_position_bias_table' in k} <= set(res.unused)
    assert torch.equal(
        res.state_dict['stages.3.blocks.0.ffn.layers.0.0.bias'],
        src['layers.3.blocks.0.mlp.fc1.bias'],
    )


def test_layouts_detected_from_keys():
    """Official keys are told from mmdet's (which mmseg, mmpretrain and mmcirc share)."""
    assert detect_layout('swin', official_swin()) == 'official'
    assert detect_layout('swin', mmdet_swin().state_dict()) == 'mmdet'
    assert detect_layout('swin', caswin().state_dict()) == 'mmdet'
