# CA-Swin-S on ImageNet-1k (mmpretrain's Swin recipe).
_base_ = './ca_swin_t_in1k.py'
model = dict(backbone=dict(arch='small', drop_path_rate=0.3))
