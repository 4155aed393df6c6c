# Core-Swin-S on ImageNet-1k with nested core training (mmpretrain's Swin recipe).
_base_ = './ca_swin_t_in1k.py'
model = dict(backbone=dict(type='CoreSwin', arch='small', drop_path_rate=0.3))
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
