"""mmcirc.apis.highres: overrides, whole-image inference against mmseg's own
inference_model, the banded upsample, memory estimates and the dense baseline child."""
import os
import os.path as osp

import cv2
import numpy as np
import pytest
import torch

from helpers import REPO
from mmcirc.apis import highres as hr
from mmcirc.utils.cli import CLIError

TINY = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])
                  {extra}),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8))
"""


def tiny_config(tmp_path, base='ca_pvt_t-allcirc_fpn_80k_ade20k.py', extra='', name='tiny.py'):
    """A thin config over one of configs/ with a tiny backbone and head."""
    path = tmp_path / name
    path.write_text(TINY.format(base=osp.join(REPO, 'configs', base),
                                extra=(', ' + extra) if extra else ''))
    return str(path)


def _image(h=97, w=131, seed=0):
    rng = np.random.RandomState(seed)
    img = cv2.resize(rng.randint(0, 256, (7, 9, 3)).astype(np.uint8), (w, h),
                     interpolation=cv2.INTER_CUBIC)
    return img


def _sharpen_head(model):
    """Random init gives nearly constant predictions; spread the classifier out so the
    comparison covers many labels."""
    torch.manual_seed(0)
    with torch.no_grad():
        model.decode_head.conv_seg.weight.normal_(0, 2.0)


# --------------------------------------------------------------------------- parsing
def test_parse_size():
    assert hr.parse_size(None) is None
    assert hr.parse_size('4096') == 4096
    assert hr.parse_size('97x131') == (97, 131)
    for bad in ('0', 'x', '12x', '-3', 'big', '3x0'):
        with pytest.raises(CLIError, match='--size'):
            hr.parse_size(bad)
    img = np.zeros((50, 100, 3), np.uint8)
    assert hr.resize_image(img, 300).shape == (150, 300, 3)
    assert hr.resize_image(img, (97, 131)).shape == (97, 131, 3)


@pytest.mark.parametrize('kwargs,option,allowed', [
    (dict(boundary='wrap'), '--boundary', "('circular', 'zero')"),
    (dict(scale='log'), '--scale', "('sqrt_n', 'n')"),
    (dict(num_cores='huge'), '--num-cores', "('mobile', 'edge', 'server')"),
    (dict(num_cores='0'), '--num-cores', "('mobile', 'edge', 'server')"),
    (dict(stage_attentions='dense'), '--stage-attentions', "'circulant', 'core', 'sra'"),
])
def test_unknown_override_names_option_and_values(kwargs, option, allowed):
    with pytest.raises(CLIError) as err:
        hr.validate_overrides(**kwargs)
    assert option in str(err.value) and allowed in str(err.value)


def test_validate_overrides_values():
    assert hr.validate_overrides(num_cores='8', boundary='zero', scale='n') == dict(
        num_cores=8, boundary='zero', scale='n')
    assert hr.validate_overrides(num_cores='mobile', scale='0.5') == dict(num_cores='mobile', scale=0.5)
    assert hr.validate_overrides(stage_attentions='core,sra,core,sra') == dict(
        stage_attentions=('core', 'sra', 'core', 'sra'))


def test_num_cores_above_bank_is_an_error(tmp_path):
    with pytest.raises(CLIError, match='num_cores_max=64'):
        hr.load_highres_config(tiny_config(tmp_path, 'core_pvt_t-allcore_fpn_80k_ade20k.py'),
                               overrides=dict(num_cores=65))


def test_whole_mode_is_forced(tmp_path):
    cfg = hr.load_highres_config(
        tiny_config(tmp_path), cfg_options={'model.test_cfg': dict(mode='slide', crop_size=(64, 64),
                                                                   stride=(32, 32))})
    assert cfg.model.test_cfg == dict(mode='whole')
    assert cfg.highres_replaced_test_cfg['mode'] == 'slide'


# --------------------------------------------------------------------------- overrides
def test_overrides_reach_every_stage_and_block(tmp_path):
    cfg = hr.load_highres_config(
        tiny_config(tmp_path, 'core_pvt_t-allcore_fpn_80k_ade20k.py'),
        overrides=hr.validate_overrides(num_cores='5', boundary='zero', scale='n',
                                        stage_attentions='core,circulant,core,circulant'))
    model = hr.build_segmentor(cfg)
    bb = model.backbone
    assert bb.stage_attentions == ('core', 'circulant', 'core', 'circulant')
    core_stages = [s for s in bb.layers if s.attention == 'core']
    circ_blocks = [m for m in bb.modules() if type(m).__name__ == 'CirculantBlock']
    assert len(core_stages) == 2 and len(circ_blocks) == 2
    assert all(s.num_cores == 5 for s in core_stages) and bb.num_cores == 5
    assert all(b.attn.boundary == 'zero' and b.attn.scale == 'n' for b in circ_blocks)
    # and the forward really runs with C' = 5 cores in every core block
    seen = []
    hooks = [m.attn.register_forward_pre_hook(lambda mod, args: seen.append(args[1].shape[1]))
             for m in bb.modules() if type(m).__name__ == 'CoreBlock']
    hr.predict_labels(model, _image(33, 45))
    for h in hooks:
        h.remove()
    assert seen == [5, 5]
    summary = hr.backbone_summary(bb)
    assert summary['num_cores'] == 5 and summary['boundary'] == 'zero' and summary['scale'] == 'n'


def test_preset_num_cores(tmp_path):
    cfg = hr.load_highres_config(tiny_config(tmp_path, 'core_pvt_t-allcore_fpn_80k_ade20k.py'),
                                 overrides=dict(num_cores='mobile'))
    model = hr.build_segmentor(cfg)
    assert [s.num_cores for s in model.backbone.layers] == [8, 8, 8, 8]


# --------------------------------------------------------------------------- inference
@pytest.mark.parametrize('shape', [(97, 131), (64, 50), (8, 8)])  # generic / channel-vectorised kernels
@pytest.mark.parametrize('channels', [150, 37, 16, 5])
def test_upsample_argmax_equals_full(shape, channels):
    from mmseg.models.utils import resize
    torch.manual_seed(0)
    logits = torch.randn(1, channels, (shape[0] + 3) // 4, (shape[1] + 3) // 4)
    if channels > 20:
        logits[:, 20] = logits[:, 3]  # exact ties across bands: the first index must win
        logits[:, 5] = logits[:, 3]
    full = resize(logits, size=shape, mode='bilinear', align_corners=False).argmax(1)[0]
    for band in (16, 32, 48, 160):
        assert torch.equal(hr.upsample_argmax(logits, shape, False, band=band), full)
    with pytest.raises(ValueError, match='multiple of 16'):
        hr.upsample_argmax(logits, shape, False, band=5)


def test_predict_labels_equals_mmseg_inference_model(tmp_path):
    """Our whole-image path == mmseg's inference_model (its own pipeline, without the
    config's Resize, and its test_step) on the same model and image file."""
    from mmseg.apis import inference_model
    cfg = hr.load_highres_config(tiny_config(tmp_path))
    model = hr.build_segmentor(cfg)
    _sharpen_head(model)
    img = _image()
    path = str(tmp_path / 'img.png')
    cv2.imwrite(path, img)
    model.cfg.test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackSegInputs')]
    ref = inference_model(model, path).pred_sem_seg.data[0].numpy()
    assert ref.shape == (97, 131) and len(np.unique(ref)) > 5
    for mode in ('banded', 'mmseg'):
        labels, times = hr.predict_labels(model, hr.read_image(path), upsample=mode)
        assert times['upsample'] == mode and times['time_s'] > 0
        np.testing.assert_array_equal(labels, ref)


def test_read_image_errors(tmp_path):
    bad = tmp_path / 'bad.png'
    bad.write_bytes(b'not a png')
    for path in (str(bad), str(tmp_path / 'missing.jpg'), str(tmp_path)):
        with pytest.raises(CLIError) as err:
            hr.read_image(path)
        assert str(err.value) == f'cannot read image: {path}'


def test_palette_from_config_without_checkpoint(tmp_path):
    model = hr.build_segmentor(hr.load_highres_config(tiny_config(tmp_path)))
    assert len(model.dataset_meta['classes']) == 150 and model.dataset_meta['classes'][0] == 'wall'
    color = hr.colorize(np.array([[0, 149]]), model.dataset_meta['palette'])
    assert color.dtype == np.uint8 and color.shape == (1, 2, 3)


# --------------------------------------------------------------------------- memory
@pytest.mark.parametrize('base,attn', [('ca_pvt_t-allcirc_fpn_80k_ade20k.py', 'sra'),
                                       ('ca_swin_t_upernet_160k_ade20k.py', 'window')])
def test_stage_grids_match_forward(tmp_path, base, attn):
    from mmengine.config import Config
    from mmseg.registry import MODELS
    bcfg = Config.fromfile(osp.join(REPO, 'configs', base)).model.backbone
    bcfg.update(init_cfg=None, stage_attentions=attn)
    bcfg.arch = dict(embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])
    bb = MODELS.build(bcfg).eval()
    with torch.no_grad():
        outs = bb(torch.zeros(1, 3, 97, 131))
    assert hr._stage_grids(bb, (97, 131)) == [tuple(o.shape[2:]) for o in outs]
    est = hr.quadratic_attention_estimates(bb, (97, 131))
    assert [e['attention'] for e in est] == [attn] * 4


def test_quadratic_warning_only_where_it_does_not_fit(tmp_path):
    from mmseg.registry import MODELS
    paper = hr.load_highres_config(tiny_config(tmp_path, 'ca_pvt_t_fpn_80k_ade20k.py'))
    paper.model.backbone.init_cfg = None
    bb = MODELS.build(paper.model.backbone)
    assert bb.stage_attentions == ('circulant', 'circulant', 'sra', 'sra')
    est = hr.quadratic_attention_estimates(bb, (4096, 4096))
    # stage 3: 256 x 256 tokens, sr 2 -> 128 x 128 keys, 1 head, scores + softmax
    assert est[0]['stage'] == 3 and est[0]['queries'] == 65536 and est[0]['keys'] == 16384
    assert est[0]['bytes'] == 2 * 4 * 65536 * 16384
    assert hr.quadratic_warning(bb, (97, 131)) is None
    warn = hr.quadratic_warning(bb, (8192, 8192))
    assert warn.startswith('WARNING:') and 'quadratic' in warn and 'stage 3' in warn
    assert '\n' not in warn
    allcirc = hr.load_highres_config(tiny_config(tmp_path))
    allcirc.model.backbone.init_cfg = None
    assert hr.quadratic_warning(MODELS.build(allcirc.model.backbone), (8192, 8192)) is None


def test_write_atomic_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / 'out'
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    with pytest.raises(OSError):
        hr.write_atomic({str(out / 'a.png'): b'1', str(blocker / 'b.json'): b'2'})
    assert not list(out.iterdir())
    hr.write_atomic({str(out / 'a.png'): b'1', str(out / 'a.json'): b'2'})
    assert sorted(os.listdir(out)) == ['a.json', 'a.png']


def test_dense_baseline_child_reports_out_of_memory(tmp_path):
    """sr ratio 1 at 1024 px: stage 1 wants a 65536 x 65536 attention matrix (16 GiB),
    which a 6 GiB address-space cap refuses at once; the child reports it."""
    cfg = tiny_config(tmp_path)
    res = hr.run_dense_baseline(cfg, _image(1024, 1024), mem_cap_gb=6,
                                cfg_options={'model.backbone.sr_ratios': [1, 1, 1, 1]}, timeout=600)
    assert res['status'] == 'out_of_memory', res
    assert res['stage_attentions'] == ['sra'] * 4
    assert res['failed_during'] == 'inference' and res['time_s'] is not None
    assert res['input_size'] == [1024, 1024] and res['mem_cap_gb'] == 6
    assert res['attention_estimates'][0]['keys'] == 65536
