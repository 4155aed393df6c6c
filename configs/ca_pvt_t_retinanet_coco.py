# CA-PVT-T + RetinaNet 1x on COCO: mmdet's PVT-T recipe (AdamW 1e-4, wd 1e-4, 12 epochs,
# 8 GPUs x 2 images), backbone swapped for circulant attention in stages 1-2.
# Pretrained weights: tools/model_converters/pvt_to_mmcirc.py writes the file below.
_base_ = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(
        _delete_=True,
        type='CAPVT',
        arch='tiny',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='work_dirs/pretrained/ca_pvt_t_in1k.pth'),
    ),
    neck=dict(in_channels=[64, 128, 320, 512]),
)
auto_scale_lr = dict(enable=False, base_batch_size=16)
