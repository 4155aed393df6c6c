# CA-Swin-S + Mask R-CNN 3x on COCO.
_base_ = './ca_swin_t_mask-rcnn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.3,
        init_cfg=dict(checkpoint='work_dirs/pretrained/ca_swin_s_in1k.pth'),
    )
)
