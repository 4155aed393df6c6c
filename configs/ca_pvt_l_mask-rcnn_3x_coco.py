# CA-PVT-L + Mask R-CNN 3x on COCO.
_base_ = './ca_pvt_s_mask-rcnn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='large',
        drop_path_rate=0.2,
        init_cfg=dict(checkpoint='work_dirs/pretrained/ca_pvt_l_in1k.pth'),
    )
)
