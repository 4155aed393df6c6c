# CA-Swin-B on ImageNet-1k (mmpretrain's Swin recipe).
_base_ = './ca_swin_t_in1k.py'
model = dict(backbone=dict(arch='base', drop_path_rate=0.5), head=dict(in_channels=1024))
