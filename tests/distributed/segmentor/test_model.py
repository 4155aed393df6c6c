"""Sharded whole-model inference (mmcirc.distributed.segmentor.model) on 2 and 3 gloo
ranks against the single-process segmentor: tiny models of every supported family
(CA-PVT / Core-PVT with Semantic FPN and UperNet, mixed stage layouts, both boundaries,
the chunked core gather; CA-DeiT and VECA with UperNet) at sizes whose rows do not divide
by 2 or 3. Logits within 1e-4 relative, labels identical.

The models are built here (one run_parallel call per world size forks them); each rank
shards its copy and predicts its band, rank 0 returns the assembled labels and logits."""

import os.path as osp

import numpy as np
import pytest
import torch

from helpers import REPO, TINY_ISOTROPIC, TINY_ISOTROPIC_ARCH
from mmcirc.distributed import run_parallel

PVT = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 2]){extra}),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8))
"""
UPER = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 2]){extra}),
    neck=None,
    decode_head=dict(_delete_=True, type='UPerHead', in_channels=[8, 16, 24, 32],
                     in_index=[0, 1, 2, 3], pool_scales=(1, 2, 3, 6), channels=8,
                     dropout_ratio=0.1, num_classes=150, align_corners=False,
                     norm_cfg=dict(type='GN', num_groups=2),
                     loss_decode=dict(type='CrossEntropyLoss', loss_weight=1.0)))
"""
HEAD = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 2]){extra}),
    neck=None,
    decode_head=dict(_delete_=True, channels=8, num_classes=150,
                     dropout_ratio=0.1, align_corners=False, norm_cfg=dict(type='GN', num_groups=2),
                     loss_decode=dict(type='CrossEntropyLoss', loss_weight=1.0), {head}),
    auxiliary_head=dict(type='FCNHead', in_channels=24, in_index=2, channels=8, num_convs=1,
                        num_classes=150, norm_cfg=dict(type='GN', num_groups=2),
                        loss_decode=dict(type='CrossEntropyLoss', loss_weight=0.4)))
"""
CA_PVT, CORE_PVT = 'ca_pvt_t-allcirc_fpn_80k_ade20k.py', 'core_pvt_t-allcore_fpn_80k_ade20k.py'
# name: (template, base config, backbone extra, (H, W))
CASES = {
    'ca_pvt_fpn_mixed': (PVT, CA_PVT, "stage_attentions=('circulant', 'core', 'sra', 'sra')", (70, 100)),
    'ca_pvt_fpn_zero': (PVT, CA_PVT, "boundary='zero'", (70, 100)),
    'core_pvt_fpn_chunked': (PVT, CORE_PVT, 'core_chunk_size=16, num_cores=5', (70, 100)),
    # PVTv2's FFN (a 3 x 3 depthwise conv between its linears) in stage 1: mmdet's block
    'ca_pvt_fpn_conv_ffn': (PVT, 'ca_pvt_t_fpn_80k_ade20k.py', "block_cfgs=[dict(type='SRABlock', use_conv_ffn=True), None, None, None]", (70, 100)),
    'ca_pvt_upernet_gn': (UPER, CA_PVT, "stage_attentions=('circulant', 'sra', 'core', 'circulant')", (67, 45)),
    # heads with no sharded code of their own (the proof): their mmseg forwards, banded
    'ca_pvt_psphead': (HEAD, CA_PVT, "type='PSPHead', in_channels=32, in_index=3, pool_scales=(1, 2, 3, 6)", (67, 45)),
    'ca_pvt_aspphead': (HEAD, CA_PVT, "type='ASPPHead', in_channels=32, in_index=3, dilations=(1, 2, 3)", (67, 45)),
    'ca_pvt_segformerhead': (HEAD, CA_PVT, "type='SegformerHead', in_channels=[8, 16, 24, 32], in_index=[0, 1, 2, 3]", (67, 45)),
    'ca_pvt_fcnhead_aux': (HEAD, CA_PVT, "type='FCNHead', in_channels=16, in_index=1, num_convs=2, concat_input=True", (67, 45)),
    'ca_deit_upernet': (TINY_ISOTROPIC, 'ca_deit_s_upernet_160k_ade20k.py', '', (100, 70)),
    'veca_upernet': (TINY_ISOTROPIC, 'veca_b_upernet_160k_ade20k.py', '', (100, 70)),
}  # fmt: skip


def _config(tmp, name):
    template, base, extra, _ = CASES[name]
    path = tmp / f'{name}.py'
    full = osp.join(REPO, 'configs', base)
    if template is TINY_ISOTROPIC:
        arch, more = TINY_ISOTROPIC_ARCH[base]
        path.write_text(template.format(base=full, arch=arch, extra=more))
    elif template is HEAD:
        path.write_text(template.format(base=full, extra='', head=extra))
    else:
        path.write_text(template.format(base=full, extra=', ' + extra))
    return str(path)


def _image(name):
    h, w = CASES[name][3]
    return np.random.RandomState(len(name)).randint(0, 256, (h, w, 3)).astype(np.uint8)


def _reference(model, img):
    """Single-process logits of the decode head and mmseg's labels at image size."""
    from mmseg.models.utils import resize

    inputs = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
    with torch.no_grad():
        x = model.data_preprocessor(dict(inputs=[inputs]), False)['inputs']
        logits = model.decode_head(model.extract_feat(x))
        up = resize(
            logits, img.shape[:2], mode='bilinear', align_corners=model.decode_head.align_corners
        )
    return logits, up.argmax(1)[0]


@pytest.fixture(scope='module')
def models(tmp_path_factory):
    from mmcirc.apis.builder import build_model

    tmp = tmp_path_factory.mktemp('shard_models')
    out = {}
    for name in CASES:
        model = build_model(_config(tmp, name), seed=0)
        out[name] = (model, *_reference(model, _image(name)))
    return out


def _worker(models):
    from mmcirc.distributed.segmentor.model import predict_sharded, shard_model

    out = {}
    for name, (model, _, _) in models.items():
        labels, logits = predict_sharded(
            shard_model(model), _image(name), CASES[name][3], logits=True
        )
        out[name] = (labels, logits)
    return out


@pytest.fixture(scope='module', params=[2, 3])
def sharded(request, models):
    torch.set_num_threads(1)
    return run_parallel(_worker, request.param, args=(models,))


@pytest.mark.parametrize('name', list(CASES))
def test_sharded_logits_and_labels_equal_single_process(models, sharded, name):
    _, ref_logits, ref_labels = models[name]
    labels, logits = sharded[0][name]
    assert logits.shape == ref_logits.shape
    rel = (logits - ref_logits).abs().max() / ref_logits.abs().max()
    assert rel < 1e-4, f'{name}: relative error {rel:.2e}'
    assert torch.equal(labels, ref_labels)
    assert all(sharded[r][name] == (None, None) for r in range(1, len(sharded)))


def test_swin_window_stages_refused_before_anything_runs():
    from mmcirc.apis.builder import build_model
    from mmcirc.distributed.segmentor.model import shard_model

    model = build_model(osp.join(REPO, 'tests', 'fixtures', 'configs', 'ca_swin_upernet_tiny.py'))
    with pytest.raises(
        ValueError, match=r"shifted-window attention \('window'\).*set stage_attentions"
    ) as err:
        shard_model(model)
    assert len(str(err.value).splitlines()) == 1
    assert not any('Sharded' in type(m).__name__ for m in model.modules())  # nothing swapped


def test_world_size_above_the_smallest_map_is_refused(models):
    from mmcirc.distributed.segmentor.model import check_size, map_heights

    model = models['ca_deit_upernet'][0]
    assert min(map_heights(model, (100, 70))) == 3  # 100 / 16 -> 7 rows, the 0.5x level 3
    check_size(model, (100, 70), 3)
    with pytest.raises(
        ValueError, match=r'world_size=4 .* 3 rows .* largest usable number of processes is 3'
    ):
        check_size(model, (100, 70), 4)


def test_backbone_op_without_a_handler_named_in_one_line(tmp_path, models):
    """One rule for the whole model, found by tracing its band-wise forward once: an op
    with no handler (here a max pool in place of PVTv2's FFN conv) is refused, naming
    the module and the op, before anything is swapped."""
    import copy

    model = copy.deepcopy(models['ca_pvt_fpn_conv_ffn'][0])
    ffn = model.backbone.stages[0].blocks[0].ffn.layers
    ffn[1] = torch.nn.MaxPool2d(3, 1, 1)
    from mmcirc.distributed.segmentor.model import shard_model

    with pytest.raises(
        ValueError,
        match=r'^backbone\.layers\.0\.blocks\.0\.ffn\.layers\.1: sharded inference: '
        r'F\.max_pool2d has no handler',
    ) as err:
        shard_model(model)
    assert len(str(err.value).splitlines()) == 1
    assert not any('Sharded' in type(m).__name__ for m in model.modules())


def test_decode_head_op_without_a_handler_named_in_one_line(tmp_path):
    """DANet's position attention multiplies all positions with all (torch.matmul over
    the rows): no handler, refused naming the module and the op."""
    from mmcirc.apis.builder import build_model
    from mmcirc.distributed.segmentor.model import shard_model

    path = tmp_path / 'fcn_head.py'
    head = (
        "decode_head=dict(_delete_=True, type='DAHead', in_channels=8, channels=8, "
        'pam_channels=4, num_classes=150, in_index=0)'
    )
    text = PVT.format(base=osp.join(REPO, 'configs', CA_PVT), extra='')
    path.write_text(text.replace('decode_head=dict(in_channels=[8, 8, 8, 8], channels=8)', head))
    model = build_model(str(path))
    with pytest.raises(
        ValueError, match=r'^decode_head\.pam\S*: sharded inference: \S+ has no handler'
    ) as err:
        shard_model(model)
    assert len(str(err.value).splitlines()) == 1
    assert not any('Sharded' in type(m).__name__ for m in model.modules())


def _chunked_ffn_worker(models, name):
    import mmcirc.models.blocks.mlp_chunks as base
    from mmcirc.distributed.segmentor.model import predict_sharded, shard_model

    base.FFN_CHUNK_TOKENS = 16  # every stage's band has more tokens than one chunk
    model = models[name][0]
    return predict_sharded(shard_model(model), _image(name), CASES[name][3], logits=True)


def test_token_chunked_ffn_inference_sharded_equals_single_process(models):
    """Inference runs the per-token MLP over chunks of tokens (blocks.mlp_chunks);
    on a banded map the same forward must stay exact (the reference is unchunked)."""
    name = 'ca_pvt_fpn_mixed'
    torch.set_num_threads(1)
    (labels, logits), _ = run_parallel(_chunked_ffn_worker, 2, args=(models, name))
    _, ref_logits, ref_labels = models[name]
    rel = (logits - ref_logits).abs().max() / ref_logits.abs().max()
    assert rel < 1e-4, f'relative error {rel:.2e}'
    assert torch.equal(labels, ref_labels)
