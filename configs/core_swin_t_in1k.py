# Core-Swin-T on ImageNet-1k with nested core training (mmpretrain's Swin recipe).
_base_ = './ca_swin_t_in1k.py'
model = dict(backbone=dict(type='CoreSwin', arch='tiny', drop_path_rate=0.2))
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
