# Core-Swin-T + Mask R-CNN 1x on COCO (Swin recipe, nested core training).
_base_ = './ca_swin_t_mask-rcnn_1x_coco.py'
model = dict(
    backbone=dict(
        type='CoreSwin',
        arch='tiny',
        drop_path_rate=0.2,
        init_cfg=dict(checkpoint='work_dirs/pretrained/core_swin_t_in1k.pth'),
    )
)
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
