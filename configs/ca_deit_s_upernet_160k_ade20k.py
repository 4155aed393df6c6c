# CA-DeiT-S + UperNet, 160k iterations on ADE20K at 512x512, from the released ImageNet
# weights: mmseg's DeiT-S UperNet recipe (multi-level neck turning the blocks 3, 6, 9,
# 12 outputs (stride 16) into strides 4, 8, 16, 32; AdamW 6e-5, wd 0.01, poly, 8 GPUs
# x 2 images). Weights: tools/model_converters/cadeit_to_mmcirc.py ca_deit_small.pth
# --family deit (-> work_dirs/pretrained/ca_deit_s_official.pth).
_base_ = 'mmseg::vit/vit_deit-s16_mln_upernet_8xb2-160k_ade20k-512x512.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='CADeiT',
        arch='small',
        out_indices=(2, 5, 8, 11),
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/pretrained/ca_deit_s_official.pth',
            prefix='backbone.',
        ),
    ),
)
