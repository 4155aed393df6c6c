# CA-Swin-S + UperNet 160k on ADE20K (mmseg's Swin recipe).
_base_ = './ca_swin_t_upernet_160k_ade20k.py'
model = dict(
    backbone=dict(arch='small', init_cfg=dict(checkpoint='work_dirs/pretrained/ca_swin_s_in1k.pth'))
)
