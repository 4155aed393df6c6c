# CA-PVT-M + RetinaNet 1x on COCO (mmdet's PVT recipe).
_base_ = './ca_pvt_t_retinanet_coco.py'
model = dict(
    backbone=dict(
        arch='medium',
        drop_path_rate=0.2,
        init_cfg=dict(checkpoint='work_dirs/pretrained/ca_pvt_m_in1k.pth'),
    )
)
