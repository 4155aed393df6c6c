# Core-PVT-S + Semantic FPN 80k on ADE20K (nested core training).
_base_ = './ca_pvt_t_fpn_80k_ade20k.py'
model = dict(
    backbone=dict(
        type='CorePVT',
        arch='small',
        init_cfg=dict(checkpoint='work_dirs/pretrained/core_pvt_s_in1k.pth'),
    )
)
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
