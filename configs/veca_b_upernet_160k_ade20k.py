# VECA-B + UperNet, 160k iterations on ADE20K at 512x512, from the released VECA-B
# weights: mmseg's ViT-B UperNet recipe (multi-level neck from blocks 3, 6, 9, 12;
# AdamW 6e-5, wd 0.01, poly, 8 GPUs x 2 images). All 64 cores; choose C' at test time
# (--cfg-options model.backbone.num_cores=8, a multiple of 8, or 'mobile' / 'edge' /
# 'server'). Weights: tools/model_converters/veca_to_mmcirc.py <VECA-B file>
# (-> work_dirs/pretrained/veca_base_official.pth; if its meta 'backbone' lists
# settings other than the defaults, e.g. out_channels, set them here too).
_base_ = 'mmseg::vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='VECAViT',
        arch='base',
        out_indices=(2, 5, 8, 11),
        num_cores=64,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/pretrained/veca_base_official.pth',
            prefix='backbone.',
        ),
    ),
)
