# The README's segmentation job: configs/ca_pvt_t_fpn_80k_ade20k.py on the generated
# ADE20K-format shapes (tools/dataset_converters/make_toy_data.py). Only data, image size
# and schedule differ; it trains from scratch (no ImageNet weights offline).
_base_ = '../ca_pvt_t_fpn_80k_ade20k.py'

data_root = 'data/toy_ade/ADEChallengeData2016'
metainfo = dict(
    classes=('sky', 'ground', 'circle', 'square', 'triangle'),
    palette=[[135, 180, 230], [120, 95, 70], [220, 40, 40], [40, 190, 60], [50, 60, 225]],
)
crop_size = (128, 128)

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(init_cfg=None),
    decode_head=dict(num_classes=5),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(128, 128), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
dataset = dict(
    type='BaseSegDataset',
    data_root=data_root,
    metainfo=metainfo,
    reduce_zero_label=True,
    img_suffix='.jpg',
    seg_map_suffix='.png',
)
train_dataloader = dict(
    batch_size=8,
    num_workers=2,
    dataset=dict(
        **dataset,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    dataset=dict(
        **dataset,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline,
    ),
)
test_dataloader = val_dataloader

max_iters = 300
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', power=1.0, eta_min=1e-5, by_epoch=False, begin=30, end=max_iters),
]
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=max_iters), logger=dict(interval=20))
# seeded: the same command gives the same metrics on the same machine
randomness = dict(seed=0, deterministic=True)
