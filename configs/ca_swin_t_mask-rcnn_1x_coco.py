# CA-Swin-T + Mask R-CNN 1x on COCO: mmdet's Swin-T recipe (AdamW 1e-4, wd 0.05, no
# decay on norms), circulant attention in stages 1-2, shifted windows in stages 3-4.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'
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
