# CA-PVT-T on ImageNet-1k: PVT was trained with DeiT's recipe (300 epochs, AdamW 1e-3 at
# batch 1024, wd 0.05, Mixup/CutMix, label smoothing), which mmpretrain's Swin-T config
# implements; the backbone and head width are swapped.
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(_delete_=True, type='CAPVT', arch='tiny', out_indices=(3,), drop_path_rate=0.1),
    head=dict(in_channels=512),
)
