# Core-PVT-T on ImageNet-1k with nested core training (DeiT/PVT recipe).
_base_ = './ca_pvt_t_in1k.py'
model = dict(backbone=dict(type='CorePVT', arch='tiny'))
custom_hooks = [dict(type='NestedCoreHook', max_cores=64)]
