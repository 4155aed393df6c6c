# CA-Swin-T + UperNet, 160k iterations on ADE20K at 512x512: mmseg's Swin-T recipe
# (AdamW 6e-5, wd 0.01, poly, 8 GPUs x 2 images), circulant attention in stages 1-2.
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(
        _delete_=True,
        type='CASwin',
        arch='tiny',
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint='work_dirs/pretrained/ca_swin_t_in1k.pth'),
    ),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384),
)
auto_scale_lr = dict(enable=False, base_batch_size=16)
