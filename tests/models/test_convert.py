"""Checkpoint converters (mmcirc.models.convert) on fake checkpoints.

The official PVT v1 / Swin / CA-DeiT layouts are written here from scratch from the
released key layouts (no mapping of the code under test is inverted), checked against
mmdet's own models where mmdet can read them, and the expectations (which tensor
lands where, what is new, what is unused) are computed independently: from the
source dicts and from the built models' module types.
"""

import re

import pytest
import torch
import torch.nn.functional as F
from mmdet.models.backbones import PyramidVisionTransformer, SwinTransformer
from mmdet.models.backbones.pvt import pvt_convert
from mmdet.models.backbones.swin import swin_converter

from mmcirc.engine import load_from_local_safely
from mmcirc.models.backbones import CAPVT, CASwin, CirculantBlock, CoreBlock, CorePVT, CoreSwin
from mmcirc.models.backbones.pyramid import PyramidStage
from mmcirc.models.convert import (
    ConversionError,
    build_backbone,
    convert_cadeit,
    convert_file,
    convert_pyramid,
    default_output_path,
    format_summary,
    save_checkpoint,
)

PVT_ARCH = dict(embed_dims=(8, 16, 40, 64), depths=(1, 2, 1, 1), num_heads=(1, 2, 5, 8))
PVT_IMG = 224  # position tables 56x56 ... 7x7 (+ cls token: what mmdet's pvt_convert expects)
SWIN_ARCH = dict(embed_dims=8, depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8))  # widths 8-16-32-64
WINDOW = 7


def _rand(gen):
    return lambda *shape: torch.randn(*shape, generator=gen)


def official_pvt(arch=PVT_ARCH, img=PVT_IMG, seed=0):
    """whai362/PVT v1 classification layout: q / kv / sr attention, Linear MLP,
    cls token (stage 4 position table has 1 + h*w entries), final norm and head."""
    r = _rand(torch.Generator().manual_seed(seed))
    sd, cin, stride = {}, 3, 1
    for i, (c, d) in enumerate(zip(arch['embed_dims'], arch['depths']), 1):
        p, sr, hid = (4, 2, 2, 2)[i - 1], (8, 4, 2, 1)[i - 1], c * (8, 8, 4, 4)[i - 1]
        stride *= p
        sd.update(
            {
                f'patch_embed{i}.proj.weight': r(c, cin, p, p),
                f'patch_embed{i}.proj.bias': r(c),
                f'patch_embed{i}.norm.weight': r(c),
                f'patch_embed{i}.norm.bias': r(c),
                f'pos_embed{i}': r(1, (img // stride) ** 2 + (i == 4), c),
            }
        )
        for j in range(d):
            b = f'block{i}.{j}.'
            sd.update(
                {
                    b + 'norm1.weight': r(c),
                    b + 'norm1.bias': r(c),
                    b + 'attn.q.weight': r(c, c),
                    b + 'attn.q.bias': r(c),
                    b + 'attn.kv.weight': r(2 * c, c),
                    b + 'attn.kv.bias': r(2 * c),
                    b + 'attn.proj.weight': r(c, c),
                    b + 'attn.proj.bias': r(c),
                }
            )
            if sr > 1:
                sd.update(
                    {
                        b + 'attn.sr.weight': r(c, c, sr, sr),
                        b + 'attn.sr.bias': r(c),
                        b + 'attn.norm.weight': r(c),
                        b + 'attn.norm.bias': r(c),
                    }
                )
            sd.update(
                {
                    b + 'norm2.weight': r(c),
                    b + 'norm2.bias': r(c),
                    b + 'mlp.fc1.weight': r(hid, c),
                    b + 'mlp.fc1.bias': r(hid),
                    b + 'mlp.fc2.weight': r(c, hid),
                    b + 'mlp.fc2.bias': r(c),
                }
            )
        cin = c
    c = arch['embed_dims'][-1]
    sd.update(
        {
            'cls_token': r(1, 1, c),
            'norm.weight': r(c),
            'norm.bias': r(c),
            'head.weight': r(10, c),
            'head.bias': r(10),
        }
    )
    return sd


def _relative_position_index(w):
    coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (w - 1)
    return rel[..., 0] * (2 * w - 1) + rel[..., 1]


def official_swin(arch=SWIN_ARCH, seed=0):
    """microsoft/Swin-Transformer layout: qkv window attention with bias table and
    index, attention masks of shifted blocks, unfold-order patch merging, norm, head."""
    r = _rand(torch.Generator().manual_seed(seed))
    c0 = arch['embed_dims']
    sd = {
        'patch_embed.proj.weight': r(c0, 3, 4, 4),
        'patch_embed.proj.bias': r(c0),
        'patch_embed.norm.weight': r(c0),
        'patch_embed.norm.bias': r(c0),
    }
    n = len(arch['depths'])
    for i, (d, h) in enumerate(zip(arch['depths'], arch['num_heads'])):
        c = c0 * 2**i
        for j in range(d):
            b = f'layers.{i}.blocks.{j}.'
            sd.update(
                {
                    b + 'norm1.weight': r(c),
                    b + 'norm1.bias': r(c),
                    b + 'attn.relative_position_bias_table': r((2 * WINDOW - 1) ** 2, h),
                    b + 'attn.relative_position_index': _relative_position_index(WINDOW),
                    b + 'attn.qkv.weight': r(3 * c, c),
                    b + 'attn.qkv.bias': r(3 * c),
                    b + 'attn.proj.weight': r(c, c),
                    b + 'attn.proj.bias': r(c),
                    b + 'norm2.weight': r(c),
                    b + 'norm2.bias': r(c),
                    b + 'mlp.fc1.weight': r(4 * c, c),
                    b + 'mlp.fc1.bias': r(4 * c),
                    b + 'mlp.fc2.weight': r(c, 4 * c),
                    b + 'mlp.fc2.bias': r(c),
                }
            )
            if j % 2:
                sd[b + 'attn_mask'] = r(4, WINDOW**2, WINDOW**2)
        if i < n - 1:
            sd.update(
                {
                    f'layers.{i}.downsample.reduction.weight': r(2 * c, 4 * c),
                    f'layers.{i}.downsample.norm.weight': r(4 * c),
                    f'layers.{i}.downsample.norm.bias': r(4 * c),
                }
            )
    c = c0 * 2 ** (n - 1)
    sd.update({'norm.weight': r(c), 'norm.bias': r(c), 'head.weight': r(10, c), 'head.bias': r(10)})
    return sd


def official_cadeit(width, depth, seed=0):
    """LeapLabTHU/Circulant-Attention ca_deit.py layout (timm ViT, no pos embed)."""
    r = _rand(torch.Generator().manual_seed(seed))
    c = width
    sd = {'patch_embed.proj.weight': r(c, 3, 16, 16), 'patch_embed.proj.bias': r(c)}
    for k in range(depth):
        b = f'blocks.{k}.'
        sd.update(
            {
                b + 'cpe.weight': r(c, 1, 3, 3),
                b + 'cpe.bias': r(c),
                b + 'norm1.weight': r(c),
                b + 'norm1.bias': r(c),
                b + 'attn.qkv.weight': r(3 * c, c),
                b + 'attn.gate.0.weight': r(c, c),
                b + 'attn.gate.0.bias': r(c),
                b + 'attn.proj.weight': r(c, c),
                b + 'attn.proj.bias': r(c),
                b + 'norm2.weight': r(c),
                b + 'norm2.bias': r(c),
                b + 'mlp.fc1.weight': r(4 * c, c),
                b + 'mlp.fc1.bias': r(4 * c),
                b + 'mlp.fc2.weight': r(c, 4 * c),
                b + 'mlp.fc2.bias': r(c),
            }
        )
    sd.update({'norm.weight': r(c), 'norm.bias': r(c), 'head.weight': r(10, c), 'head.bias': r(10)})
    return {'model': sd}


def replaced_params(model):
    """Independent reference: parameters of the replaced attention, found by module
    type (CPE and attention of circulant/core blocks, core banks)."""
    keys = set()
    for name, module in model.named_modules():
        if isinstance(module, (CirculantBlock, CoreBlock)):
            for sub in ('attn', 'cpe'):
                part = getattr(module, sub)
                if part is not None:
                    keys |= {f'{name}.{sub}.{p}' for p, _ in part.named_parameters()}
        elif isinstance(module, PyramidStage) and module.cores is not None:
            keys.add(f'{name}.cores')
    return keys


def mmdet_pvt():
    return PyramidVisionTransformer(
        pretrain_img_size=PVT_IMG,
        embed_dims=8,
        num_heads=[1, 2, 5, 8],
        num_layers=list(PVT_ARCH['depths']),
    )


def mmdet_swin():
    return SwinTransformer(
        embed_dims=8,
        depths=SWIN_ARCH['depths'],
        num_heads=SWIN_ARCH['num_heads'],
        window_size=WINDOW,
    )


def capvt(**kwargs):
    return CAPVT(arch=PVT_ARCH, pretrain_img_size=PVT_IMG, **kwargs)


def caswin(**kwargs):
    return CASwin(arch=SWIN_ARCH, window_size=WINDOW, **kwargs)


# ----------------------------------------------------------------------------- fakes
def test_fake_official_checkpoints_are_what_mmdet_reads():
    """The hand-written official layouts are complete: mmdet's converters + models
    take them (PVT strictly; Swin: only the per-stage output norms differ)."""
    sd = official_pvt()
    mmdet_pvt().load_state_dict(pvt_convert(sd), strict=True)

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


# ----------------------------------------------------------------------------- PVT
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


# ----------------------------------------------------------------------------- Swin
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


# ----------------------------------------------------------------------------- CA-DeiT
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


# ----------------------------------------------------------------------------- errors, output
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
    ckpt = load_from_local_safely(path)
    assert set(ckpt) == {'state_dict', 'meta'} and ckpt['meta']['source'] == 'fake.pth'
    assert ckpt['meta']['new'] == res.new and ckpt['meta']['model']['type'] == 'CAPVT'
    model = capvt(init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    for k, v in res.state_dict.items():
        assert torch.equal(model.state_dict()[k], v), k


def test_convert_file_writes_what_convert_pyramid_gives(tmp_path):
    torch.save(official_pvt(), tmp_path / 'src.pth')
    result, out, title = convert_file(
        'pvt',
        str(tmp_path / 'src.pth'),
        str(tmp_path / 'out.pth'),
        arch=PVT_ARCH,
        pos_embed_size=PVT_IMG,
    )
    ref = convert_pyramid(official_pvt(), capvt())
    ckpt = load_from_local_safely(out)
    assert set(ckpt['state_dict']) == set(ref.state_dict) and result.unused == ref.unused
    for k, v in ref.state_dict.items():
        assert torch.equal(ckpt['state_dict'][k], v), k
    assert title.startswith('PVT (official layout) -> CAPVT(')


@pytest.mark.parametrize(
    'kwargs,name',
    [
        (dict(pos_embed_size=0), 'pos_embed_size'),
        (dict(backbone_options=['num_cores_max=8']), 'backbone_options'),
        (dict(src_layout='timm'), 'src_layout'),
    ],
)
def test_convert_file_names_the_bad_parameter_and_writes_nothing(tmp_path, kwargs, name):
    torch.save(official_pvt(), tmp_path / 'src.pth')
    with pytest.raises(ConversionError, match=name):
        convert_file(
            'pvt', str(tmp_path / 'src.pth'), str(tmp_path / 'out.pth'), arch=PVT_ARCH, **kwargs
        )
    assert [p.name for p in tmp_path.iterdir()] == ['src.pth']


def test_summary_cut_says_how_to_see_all():
    res = convert_pyramid(official_pvt(), capvt())
    res.unused = [f'extra{i}.weight' for i in range(20)]  # 20 groups: 16 shown
    assert '    ... 4 more (verbose=True lists all)' in format_summary(res, 'test').splitlines()
    assert (
        '    ... 4 more (--verbose lists all)'
        in format_summary(res, 'test', more_hint='--verbose lists all').splitlines()
    )
    assert 'extra19.weight' in format_summary(res, 'test', verbose=True)


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
