# Core-Swin-S + Mask R-CNN 1x on COCO (Swin recipe, nested core training).
_base_ = './ca_swin_t_mask-rcnn_1x_coco.py'
model = dict(
    backbone=dict(
        type='CoreSwin',
        arch='small',
        drop_path_rate=0.3,
        init_cfg=dict(checkpoint='work_dirs/pretrained/core_swin_s_in1k.pth'),
    )
)
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
