# CA-PVT-S + Mask R-CNN 1x on COCO: the PVT paper's Mask R-CNN recipe (AdamW 1e-4,
# wd 1e-4, 12 epochs, 8 GPUs x 2 images) on mmdet's Mask R-CNN base.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(
        _delete_=True,
        type='CAPVT',
        arch='small',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='work_dirs/pretrained/ca_pvt_s_in1k.pth'),
    ),
    neck=dict(in_channels=[64, 128, 320, 512]),
)
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
auto_scale_lr = dict(enable=False, base_batch_size=16)
