# Core-Swin-S + UperNet 160k on ADE20K (nested core training, evaluated with 64 cores).
_base_ = './ca_swin_t_upernet_160k_ade20k.py'
model = dict(
    backbone=dict(
        type='CoreSwin',
        arch='small',
        init_cfg=dict(checkpoint='work_dirs/pretrained/core_swin_s_in1k.pth'),
    )
)
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
