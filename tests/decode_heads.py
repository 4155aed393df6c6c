"""Every decode head of mmseg's ``MODELS`` registry built into a small segmentor, for
tests/apis/test_decode.py (whole-image and sharded inference against mmseg's own).

The heads are found by walking the registry (:func:`registry_heads`): every class
registered from ``mmseg.models.decode_heads`` that has ``predict``. Each one is built
(:func:`head_cases`):

* on a tiny CA-PVT-T pyramid (channels 8, 16, 24, 32; no neck) from its own defaults,
  with ``in_channels`` / ``in_index`` set (the last level, or all four for a head that
  takes several), ``channels=8`` and the arguments it has no default for (:data:`REQUIRED`);
* a ViT head (:data:`VIT_HEADS`: SETR, Segmenter) the same way on a tiny CA-DeiT and a
  tiny VECA with mmseg's ``MultiLevelNeck`` (four maps at stride 16);
* a head that needs a particular segmentor, backbone or neck (:data:`OWN_CONFIG`) from
  mmseg's own config for it, made small: the cascades (OCRNet, PointRend) and the heads
  whose inputs a pyramid does not make keep mmseg's segmentor on a tiny CA-PVT-T or
  keep mmseg's own backbone.
"""

import os.path as osp

from helpers import REPO, TINY_ISOTROPIC_ARCH

PYRAMID = [8, 16, 24, 32]
PVT_BASE = osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py')
ISOTROPIC_BASES = {
    'CA-DeiT': osp.join(REPO, 'configs', 'ca_deit_s_upernet_160k_ade20k.py'),
    'VECA': osp.join(REPO, 'configs', 'veca_b_upernet_160k_ade20k.py'),
}
#: Arguments a head has no default for (sizes of its own layers), small.
REQUIRED = {
    'ANNHead': dict(project_channels=8),
    'DAHead': dict(pam_channels=4),
    'DepthwiseSeparableASPPHead': dict(c1_in_channels=8, c1_channels=4),
    'EMAHead': dict(ema_channels=8, num_bases=8, num_stages=2),
    'FPNHead': dict(feature_strides=[4, 8, 16, 32]),
    'ISAHead': dict(isa_channels=8),
    'PSAHead': dict(mask_size=(9, 9)),
    'SegmenterMaskTransformerHead': dict(num_layers=1, num_heads=1, embed_dims=8),
    'SETRMLAHead': dict(mla_channels=2),  # channels = 4 inputs x mla_channels
}
VIT_HEADS = ('SETRMLAHead', 'SETRUPHead', 'SegmenterMaskTransformerHead')
#: Image sizes (H, W): odd and not multiples of any stride (129 rows: every map of the
#: pyramid shards over 3 ranks); 517 x 389 for a head that shards and for LRASPP (a
#: 49-row pooling window at stride 8); multiples of 64 where mmseg's own backbone or
#: head needs them (DDRNet, PIDNet, VPD).
SMALL, ODD = (129, 71), (517, 389)
HW = {'DepthwiseSeparableASPPHead': ODD, 'LRASPPHead': ODD, 'DDRHead': (128, 192),
      'PIDHead': (128, 192), 'VPDDepthHead': (128, 192)}  # fmt: skip
#: build_model(init_weights=False): mmseg's SAN head fails in init_weights without
#: CLIP weights (mmseg's own init_model never calls it; the constructors' init stays).
NO_INIT_WEIGHTS = ('SideAdapterCLIPHead',)

PVT_HEAD = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims={dims}, depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 1])),
    neck=None,
    decode_head=dict(_delete_=True, **{head!r}))
"""
VIT_HEAD = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, {arch}), out_indices=-1, init_cfg=None{extra}),
    neck=dict(in_channels=[32], out_channels=8, scales=[1, 1, 1, 1]),
    decode_head=dict(_delete_=True, **{head!r}),
    auxiliary_head=None)
"""
MMSEG = """_base_ = 'mmseg::{path}'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
"""


def registry_heads():
    """Names of the decode heads in mmseg's MODELS registry, sorted."""
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    register_all_modules(init_default_scope=False)
    return sorted(
        name
        for name, cls in MODELS.module_dict.items()
        if cls.__module__.startswith('mmseg.models.decode_heads.') and hasattr(cls, 'predict')
    )


def tiny_pvt(dims=PYRAMID):
    """The tiny CA-PVT-T backbone dict (all-circulant) with stage widths ``dims``."""
    from mmcirc.apis.builder import load_model_config

    bb = load_model_config(PVT_BASE).model.backbone
    bb.update(init_cfg=None, arch=dict(embed_dims=list(dims), depths=[1, 1, 1, 1],
                                       num_heads=[1, 1, 1, 1]))  # fmt: skip
    return bb.to_dict()


# ----------------------------------------------------------------- mmseg's own configs
def _ocrnet(model):
    model.backbone = tiny_pvt()
    for head in model.decode_head:
        head.in_channels = PYRAMID
    model.decode_head[0].channels = sum(PYRAMID)
    model.decode_head[1].update(channels=16, ocr_channels=8)


def _pointrend(model):
    model.backbone = tiny_pvt()
    model.neck.update(in_channels=PYRAMID, out_channels=8)
    model.decode_head[0].update(in_channels=[8] * 4, channels=8)
    model.decode_head[1].update(in_channels=[8], channels=8)


def _knet(model):
    model.backbone = tiny_pvt()
    model.auxiliary_head = None
    head = model.decode_head
    head.kernel_generate_head.update(in_channels=PYRAMID, channels=16)
    for stage in head.kernel_update_head:
        stage.update(in_channels=16, out_channels=16, num_heads=2, feedforward_channels=32)
        stage.kernel_updator_cfg.update(in_channels=16, feat_channels=16, out_channels=16)


def _maskformer(model):
    model.backbone = tiny_pvt()
    model.decode_head.in_channels = PYRAMID


def _dpt(model):
    model.backbone.update(img_size=64, embed_dims=16, num_layers=4, num_heads=2,
                          out_indices=(0, 1, 2, 3))  # fmt: skip
    model.decode_head.update(in_channels=(16,) * 4, channels=8, embed_dims=16,
                             post_process_channels=[8, 8, 8, 8])  # fmt: skip
    model.auxiliary_head = None


def _vpd(model):
    dims = [16, 32, 48, 64]  # the head's GroupNorm takes 16 groups
    model.backbone = tiny_pvt(dims)
    model.decode_head.update(in_channels=dims, embed_dim=2, feature_dim=16,
                             num_deconv_filters=(8, 8, 8))  # fmt: skip


def _san(model):
    """CLIP's image encoder (3 blocks, then the mask generator's 3), text encoder (1
    block, one prompt template) and the side adapter at width 32 / 24."""
    model.image_encoder.update(embed_dims=32, num_layers=3, num_heads=2, out_indices=(0, 1, 2))
    model.text_encoder.update(embed_dims=32, num_layers=1, num_heads=2, output_dims=16,
                              templates=['a photo of a {}.'])  # fmt: skip
    san = model.decode_head.san_cfg
    san.update(clip_channels=32, embed_dims=24, num_queries=10)
    san.cfg_encoder.update(num_encode_layer=4, num_heads=2)
    san.cfg_decoder.update(num_heads=2, embed_channels=16, mlp_channels=16)
    model.decode_head.maskgen_cfg.update(sos_token_num=10, embed_dims=32, num_heads=2,
                                         out_dims=16)  # fmt: skip


def _keep(model):
    """mmseg's own backbone and head, unchanged (already small)."""
    model.pop('auxiliary_head', None)


#: head -> (mmseg config, how it is made small, why it is built there).
OWN_CONFIG = {
    'OCRHead': ('ocrnet/ocrnet_hr18_4xb4-80k_ade20k-512x512.py', _ocrnet,
                'a cascade (CascadeEncoderDecoder, after an FCNHead)'),
    'PointHead': ('point_rend/pointrend_r50_4xb4-160k_ade20k-512x512.py', _pointrend,
                  'a cascade (CascadeEncoderDecoder, FPN neck, after an FPNHead)'),
    'IterativeDecodeHead': ('knet/knet-s3_r50-d8_upernet_8xb2-adamw-80k_ade20k-512x512.py',
                            _knet, 'K-Net: kernel update heads around a UPerHead'),
    'MaskFormerHead': ('maskformer/maskformer_r50-d32_8xb2-160k_ade20k-512x512.py',
                       _maskformer, "mmdet's pixel decoder and transformer decoder"),
    'Mask2FormerHead': ('mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py',
                        _maskformer, "mmdet's deformable pixel decoder; test-time padding"),
    'DPTHead': ('dpt/dpt_vit-b16_8xb2-160k_ade20k-512x512.py', _dpt,
                "ViT features with class tokens (mmseg's VisionTransformer)"),
    'PIDHead': ('pidnet/pidnet-s_2xb6-120k_1024x1024-cityscapes.py', _keep,
                "PIDNet's one integral map at inference (mmseg's PIDNet-S)"),
    'DDRHead': ('ddrnet/ddrnet_23-slim_in1k-pre_2xb6-120k_cityscapes-1024x1024.py', _keep,
                "DDRNet's one map at inference (mmseg's DDRNet-23-slim)"),
    'LRASPPHead': ('mobilenet_v3/mobilenet-v3-d8_lraspp_4xb4-320k_cityscapes-512x1024.py',
                   _keep, "a 49 x 49 pooling window at stride 8 (mmseg's MobileNetV3)"),
    'SideAdapterCLIPHead': ('san/san-vit-b16_coco-stuff164k-640x640.py', _san,
                            'SAN: CLIP image and text encoders (MultimodalEncoderDecoder)'),
    'VPDDepthHead': ('vpd/vpd_sd_4xb8-25k_nyu-480x480.py', _vpd,
                     'depth estimation (DepthEstimator)'),
}  # fmt: skip


#: What a head on the pyramid is given, first that builds: the last level, all four,
#: the last two (ANNHead: a low and a high level).
INPUTS = [(PYRAMID[-1], 3, 'last level'), (PYRAMID, [0, 1, 2, 3], 'four levels'),
          (PYRAMID[2:], [2, 3], 'last two levels')]  # fmt: skip


def _inputs(name, required):
    """(in_channels, in_index, words) of the first of :data:`INPUTS` the head builds with."""
    from mmseg.registry import MODELS

    for channels, index, words in INPUTS:
        try:
            MODELS.build(dict(type=name, in_channels=channels, in_index=index, channels=8,
                              num_classes=150, **required))  # fmt: skip
        except (AssertionError, TypeError, ValueError, IndexError):
            continue
        return channels, index, words
    raise AssertionError(f'{name} builds with none of {INPUTS}: add it to OWN_CONFIG')


def head_cases():
    """{case: dict(head, backbone, built, write, hw, init_weights)}: ``write(tmp_dir,
    case)`` writes the case's config and returns its path; ``built`` says how it was
    built, ``hw`` the image size."""
    cases = {}
    for name in registry_heads():
        required = REQUIRED.get(name, {})
        if name in OWN_CONFIG:
            path, shrink, why = OWN_CONFIG[name]
            built = f"mmseg's `{osp.splitext(osp.basename(path))[0]}`: {why}"
            cases[name] = dict(head=name, backbone=None, built=built,
                               write=_own_writer(name, path, shrink))  # fmt: skip
        elif name in VIT_HEADS:
            for bb, base in ISOTROPIC_BASES.items():
                head = dict(type=name, in_channels=8, in_index=3, channels=8, num_classes=150,
                            **required)  # fmt: skip
                if name == 'SETRMLAHead':
                    head.update(in_channels=[8] * 4, in_index=[0, 1, 2, 3])
                arch, extra = TINY_ISOTROPIC_ARCH[osp.basename(base)]
                text = VIT_HEAD.format(base=base, arch=arch, extra=extra, head=head)
                cases[f'{name}-{bb}'] = dict(head=name, backbone=bb, write=_text_writer(text),
                                             built=f'{bb} + MultiLevelNeck')  # fmt: skip
        else:
            channels, index, words = _inputs(name, required)
            head = dict(type=name, in_channels=channels, in_index=index, channels=8,
                        num_classes=150, **required)  # fmt: skip
            text = PVT_HEAD.format(base=PVT_BASE, dims=PYRAMID, head=head)
            cases[name] = dict(head=name, backbone='CA-PVT-T', write=_text_writer(text),
                               built=f'CA-PVT-T, {words}')  # fmt: skip
    for case, spec in cases.items():
        spec.update(
            hw=HW.get(spec['head'], SMALL), init_weights=spec['head'] not in NO_INIT_WEIGHTS
        )
    return cases


def _text_writer(text):
    def write(tmp, name):
        path = tmp / f'{name}.py'
        path.write_text(text)
        return str(path)

    return write


def _own_writer(name, path, shrink):
    def write(tmp, case):
        from mmcirc.apis.builder import load_model_config

        thin = tmp / f'{case}_thin.py'
        thin.write_text(MMSEG.format(path=path))
        cfg = load_model_config(str(thin))
        shrink(cfg.model)
        out = tmp / f'{case}.py'
        cfg.dump(str(out))
        return str(out)

    return write
