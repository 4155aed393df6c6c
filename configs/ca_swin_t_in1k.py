# CA-Swin-T on ImageNet-1k (300 epochs, AdamW 1e-3 at batch 1024, Mixup/CutMix, label
# smoothing): mmpretrain's Swin-T recipe with the backbone swapped. The checkpoint it
# produces is what the detection/segmentation configs load (see README).
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(_delete_=True, type='CASwin', arch='tiny', out_indices=(3,), drop_path_rate=0.2),
    head=dict(in_channels=768),
)
