# CA-PVT-S + Semantic FPN 80k on ADE20K (PVT recipe).
_base_ = './ca_pvt_t_fpn_80k_ade20k.py'
model = dict(
    backbone=dict(arch='small', init_cfg=dict(checkpoint='work_dirs/pretrained/ca_pvt_s_in1k.pth'))
)
