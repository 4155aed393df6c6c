# CA-PVT-S on ImageNet-1k (DeiT/PVT recipe).
_base_ = './ca_pvt_t_in1k.py'
model = dict(backbone=dict(arch='small', drop_path_rate=0.1))
