# Core-PVT-S + RetinaNet 1x on COCO: core attention (VECA) in stages 1-2, nested
# core training (C' sampled per iteration), evaluated with all 64 cores.
_base_ = './ca_pvt_t_retinanet_coco.py'
model = dict(
    backbone=dict(
        type='CorePVT',
        arch='small',
        init_cfg=dict(checkpoint='work_dirs/pretrained/core_pvt_s_in1k.pth'),
    )
)
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
