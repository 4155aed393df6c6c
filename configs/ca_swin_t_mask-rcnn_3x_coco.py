# CA-Swin-T + Mask R-CNN 3x on COCO: mmdet's Swin-T multi-scale + crop 36-epoch recipe.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(
        _delete_=True,
        type='CASwin',
        arch='tiny',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint='work_dirs/pretrained/ca_swin_t_in1k.pth'),
    ),
    neck=dict(in_channels=[96, 192, 384, 768]),
)
auto_scale_lr = dict(enable=False, base_batch_size=16)
