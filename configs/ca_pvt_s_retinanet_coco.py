# CA-PVT-S + RetinaNet 1x on COCO (mmdet's PVT recipe).
_base_ = './ca_pvt_t_retinanet_coco.py'
model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint='work_dirs/pretrained/ca_pvt_s_in1k.pth'),
    )
)
