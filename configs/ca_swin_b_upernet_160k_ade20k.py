# CA-Swin-B + UperNet 160k on ADE20K (mmseg's Swin recipe).
_base_ = './ca_swin_t_upernet_160k_ade20k.py'
model = dict(
    backbone=dict(arch='base', init_cfg=dict(checkpoint='work_dirs/pretrained/ca_swin_b_in1k.pth')),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512),
)
