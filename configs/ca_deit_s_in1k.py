# CA-DeiT-S on ImageNet-1k with mmpretrain.
#
# Evaluate the released weights (github.com/LeapLabTHU/Circulant-Attention, README
# "Pretrained Models"; top-1 75.0 / 81.0 / 82.3 for T / S / B) in two commands:
#   python tools/model_converters/cadeit_to_mmcirc.py ca_deit_small.pth --family deit
#   python tools/test.py configs/ca_deit_s_in1k.py work_dirs/pretrained/ca_deit_s_official.pth
# The test pipeline of the inherited config is the official one (resize the short
# edge to 256, bicubic; centre crop 224; ImageNet mean / std).
#
# Training recipe: DeiT's 300 epochs as mmpretrain writes it (AdamW 1e-3 at batch
# 1024, wd 0.05, cosine with 20 warm-up epochs, Mixup 0.8 / CutMix 1.0, label
# smoothing 0.1, RandAugment, random erasing, grad clip 5), which is what the official
# CA repository trains with; drop path as its cfgs/ca_deit_s.yaml (0.1).
_base_ = 'mmpretrain::deit/deit-small_4xb256_in1k.py'
custom_imports = dict(imports=['mmcirc'], allow_failed_imports=False)
default_hooks = dict(safe_checkpoint_io=dict(type='SafeCheckpointIOHook'))

model = dict(
    backbone=dict(
        _delete_=True, type='CADeiT', arch='small', out_type='avg_featmap', drop_path_rate=0.1
    ),
    neck=None,
    head=dict(
        _delete_=True,
        type='LinearClsHead',  # keys head.fc.*: what the converter writes
        num_classes=1000,
        in_channels=384,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
    ),
)
