# VECA-B frozen, linear segmentation head on ADE20K (the VECA paper's frozen-feature
# evaluation): the backbone is frozen (frozen_stages=12: no gradient, eval mode, no
# coordinate augmentation), its last-block patch features (stride 16, final LN) feed
# one 1x1 conv classifier (mmseg's FCNHead with no conv layers), upsampled to the
# image. 40k iterations, AdamW 1e-3, 8 GPUs x 2 images at 512x512, the mmseg ADE20K
# pipeline. C' at test time: --cfg-options model.backbone.num_cores=8 (multiples of 8).
# Weights: tools/model_converters/veca_to_mmcirc.py <VECA-B file>.
_base_ = [
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_40k.py',
]
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

crop_size = (512, 512)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=crop_size,
)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='VECAViT',
        arch='base',
        out_indices=(11,),
        num_cores=64,
        frozen_stages=12,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/pretrained/veca_base_official.pth',
            prefix='backbone.',
        ),
    ),
    decode_head=dict(
        type='FCNHead',
        in_channels=768,
        channels=768,
        num_convs=0,
        concat_input=False,
        dropout_ratio=0.0,
        num_classes=150,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    ),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'),
)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=40000, by_epoch=False),
]
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)
