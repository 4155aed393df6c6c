"""tools/infer_highres.py end to end on a tiny all-circulant CA-PVT + Semantic FPN."""
import json
import os.path as osp

import cv2
import numpy as np
import torch

from helpers import REPO, run_tool

TINY = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 1])),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8))
"""


def _tiny_config(tmp_path):
    path = tmp_path / 'tiny_allcirc.py'
    path.write_text(TINY.format(base=osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py')))
    return str(path)


def _checkpoint(cfg_path, tmp_path):
    """Random weights (classifier spread out, so many labels appear) saved as a
    checkpoint that both the tool and the reference load."""
    from mmcirc.apis import highres as hr
    model = hr.build_segmentor(hr.load_highres_config(cfg_path))
    torch.manual_seed(0)
    with torch.no_grad():
        model.decode_head.conv_seg.weight.normal_(0, 2.0)
    path = tmp_path / 'tiny.pth'
    meta = dict(dataset_meta=dict(classes=list(model.dataset_meta['classes']),
                                  palette=[list(p) for p in model.dataset_meta['palette']]))
    torch.save(dict(state_dict=model.state_dict(), meta=meta), path)
    return str(path)


def _reference(cfg_path, ckpt, img_path):
    """mmseg's own API: init_model + inference_model (its test pipeline without the
    config's 512-px Resize: the tool runs at the image's own size)."""
    from mmengine.config import Config
    from mmseg.apis import inference_model, init_model
    import mmcirc  # noqa: F401
    cfg = Config.fromfile(cfg_path)
    cfg.model.test_cfg = dict(mode='whole')
    cfg.test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackSegInputs')]
    model = init_model(cfg, ckpt, device='cpu')
    return inference_model(model, img_path).pred_sem_seg.data[0].numpy()


def test_outputs_match_mmseg_inference_model(tmp_path):
    cfg = _tiny_config(tmp_path)
    ckpt = _checkpoint(cfg, tmp_path)
    rng = np.random.RandomState(1)
    img = cv2.resize(rng.randint(0, 256, (6, 8, 3)).astype(np.uint8), (131, 97),
                     interpolation=cv2.INTER_CUBIC)
    img_path = str(tmp_path / 'scene.png')
    cv2.imwrite(img_path, img)
    out = tmp_path / 'out'
    proc = run_tool(['tools/infer_highres.py', cfg, ckpt, '--img', img_path, '--out-dir', str(out),
                     '--boundary', 'zero', '--dense-baseline'], cwd=tmp_path)
    base = out / 'scene_97x131_tiny_allcirc_zero'
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(base.name + s for s in ('.json', '_labels.png', '_mask.png', '_overlay.png'))

    labels = cv2.imread(f'{base}_labels.png', cv2.IMREAD_UNCHANGED)
    mask = cv2.imread(f'{base}_mask.png', cv2.IMREAD_UNCHANGED)
    overlay = cv2.imread(f'{base}_overlay.png', cv2.IMREAD_UNCHANGED)
    assert labels.shape == (97, 131) and mask.shape == overlay.shape == (97, 131, 3)

    # the tool uses --boundary zero; the reference must be built with it too
    ref_cfg = tmp_path / 'ref.py'
    ref_cfg.write_text(f"_base_ = {cfg!r}\nmodel = dict(backbone=dict(boundary='zero'))\n")
    ref = _reference(str(ref_cfg), ckpt, img_path)
    assert len(np.unique(ref)) > 5
    np.testing.assert_array_equal(labels, ref)
    palette = np.array(torch.load(ckpt, weights_only=False)['meta']['dataset_meta']['palette'], np.uint8)
    np.testing.assert_array_equal(mask[..., ::-1], palette[ref])

    rec = json.loads((out / f'{base.name}.json').read_text())
    assert rec['input_size'] == [97, 131] and rec['checkpoint'] == ckpt and not rec['random_weights']
    assert rec['overrides'] == {'boundary': 'zero'} and rec['backbone']['boundary'] == 'zero'
    assert rec['backbone']['stage_attentions'] == ['circulant'] * 4
    assert rec['test_cfg']['mode'] == 'whole' and rec['upsample'] == 'banded'
    assert rec['time_s'] > 0 and rec['peak_rss_mb'] >= rec['baseline_rss_mb'] > 0
    assert rec['peak_increase_mb'] >= 0
    dense = rec['dense_baseline']
    assert dense['status'] == 'ok' and dense['stage_attentions'] == ['sra'] * 4
    assert dense['mem_cap_gb'] == 20 and dense['time_s'] > 0
    lines = proc.stdout.strip().splitlines()
    assert any('dense baseline sra-sra-sra-sra' in ln and 'ran in' in ln for ln in lines)
    assert any(ln.startswith('scene 97x131 | CAPVT circulant-circulant-circulant-circulant')
               for ln in lines)


def test_unreadable_image_is_one_line_error_without_outputs(tmp_path):
    bad = tmp_path / 'broken.jpg'
    bad.write_bytes(b'\xff\xd8 truncated')
    out = tmp_path / 'out'
    for path in (str(bad), str(tmp_path / 'missing.png')):
        proc = run_tool(['tools/infer_highres.py', osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py'),
                         '--img', path, '--out-dir', str(out)], cwd=tmp_path, check=False)
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines() == [f'error: cannot read image: {path}']
        assert not out.exists()


def test_unknown_override_is_one_line_error(tmp_path):
    cfg = osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py')
    proc = run_tool(['tools/infer_highres.py', cfg, '--demo', 'astronaut', '--boundary', 'wrap',
                     '--out-dir', str(tmp_path / 'out')], cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --boundary must be one of ('circular', 'zero'), got 'wrap'"]
    assert not (tmp_path / 'out').exists()


def test_image_below_the_minimum_size_is_one_line_error(tmp_path):
    img = tmp_path / 'dot.png'
    cv2.imwrite(str(img), np.zeros((1, 1, 3), np.uint8))
    # CA-PVT-T's paper layout keeps SRA (sr_ratio 2) in stage 3, at stride 16: 17 px at least
    cfg = osp.join(REPO, 'configs', 'ca_pvt_t_fpn_80k_ade20k.py')
    proc = run_tool(['tools/infer_highres.py', cfg, '--img', str(img), '--out-dir', str(tmp_path / 'out')],
                    cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        'error: image dot is 1x1: ca_pvt_t_fpn_80k_ade20k needs at least 17x17 (use --size)']
    assert not (tmp_path / 'out').exists()
