# Core-PVT-S + Mask R-CNN 1x on COCO (PVT recipe, nested core training).
_base_ = './ca_pvt_s_mask-rcnn_1x_coco.py'
model = dict(
    backbone=dict(
        type='CorePVT',
        arch='small',
        init_cfg=dict(checkpoint='work_dirs/pretrained/core_pvt_s_in1k.pth'),
    )
)
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
