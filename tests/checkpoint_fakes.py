"""Fake released checkpoints for the converter tests (tests/models/convert/test_*.py,
tests/tools/test_model_converters.py).

The official PVT v1 / Swin / CA-DeiT layouts are written here from scratch from the
released key layouts (no mapping of the code under test is inverted); the tests check
them against mmdet's own models where mmdet can read them. The expectations (which
tensor lands where, what is new, what is unused) are computed independently: from the
source dicts and from the built models' module types (:func:`replaced_params`).
"""

import torch
from mmdet.models.backbones import PyramidVisionTransformer, SwinTransformer

from mmcirc.models.backbones import CAPVT, CASwin, CirculantBlock, CoreBlock
from mmcirc.models.backbones.pyramid import PyramidStage

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
