# CA-PVT-T + Semantic FPN, 80k iterations on ADE20K at 512x512: the PVT paper's
# segmentation recipe (AdamW 1e-4, wd 1e-4, poly; 8 GPUs x 4 images) as in mmseg's
# Twins-PCPVT Semantic FPN config, backbone swapped.
_base_ = 'mmseg::twins/twins_pcpvt-s_fpn_fpnhead_8xb4-80k_ade20k-512x512.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(
        _delete_=True,
        type='CAPVT',
        arch='tiny',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='work_dirs/pretrained/ca_pvt_t_in1k.pth'),
    ),
    neck=dict(in_channels=[64, 128, 320, 512]),
)
auto_scale_lr = dict(enable=False, base_batch_size=32)
