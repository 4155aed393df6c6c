# CA-DeiT-S + Mask R-CNN 1x on COCO from the released ImageNet weights, with ViTDet's
# simple feature pyramid (mmcirc's SimpleFeaturePyramid: strides 4, 8, 16, 32 from the
# last block's stride-16 map, plus a max-pooled P6 for the RPN). Optimiser as mmcirc's
# other transformer detectors (AdamW 1e-4, wd 0.05, no decay on norms), 12 epochs.
# Weights: tools/model_converters/cadeit_to_mmcirc.py ca_deit_small.pth --family deit.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(
        _delete_=True,
        type='CADeiT',
        arch='small',
        out_indices=(11,),
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/pretrained/ca_deit_s_official.pth',
            prefix='backbone.',
        ),
    ),
    neck=dict(
        _delete_=True, type='SimpleFeaturePyramid', in_channels=384, out_channels=256, num_outs=5
    ),
)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0),
    clip_grad=dict(max_norm=1.0, norm_type=2),
)
auto_scale_lr = dict(enable=False, base_batch_size=16)
