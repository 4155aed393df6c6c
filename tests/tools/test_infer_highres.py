"""tools/infer_highres.py: end to end on a tiny all-circulant CA-PVT + Semantic FPN and
tiny CA-DeiT / VECA UperNets (overrides, progress, one-line errors). Its tools-side
modules are tested beside them: images and PNGs in tests/cli/test_image_io.py, the
override flags' messages in tests/cli/test_override_args.py, the memory-capped
dense-baseline child in tests/cli/test_infer_highres_dense.py; sharded in
tests/distributed/segmentor/test_tool.py."""

import json
import math
import os.path as osp
import warnings

import cv2
import numpy as np
import pytest
import torch

from helpers import CADEIT_UPERNET as CADEIT
from helpers import REPO, run_tool, tiny_pyramid_config
from helpers import VECA_UPERNET as VECA
from helpers import tiny_isotropic_config as _isotropic_config

from mmcirc.cli import infer_highres


def _checkpoint(cfg_path, tmp_path):
    """Random weights (classifier spread out, so many labels appear) saved as a
    checkpoint that both the tool and the reference load."""
    from mmcirc.apis import build_model, load_highres_config

    model = build_model(load_highres_config(cfg_path))
    torch.manual_seed(0)
    with torch.no_grad():
        model.decode_head.conv_seg.weight.normal_(0, 2.0)
    path = tmp_path / 'tiny.pth'
    meta = dict(
        dataset_meta=dict(
            classes=list(model.dataset_meta['classes']),
            palette=[list(p) for p in model.dataset_meta['palette']],
        )
    )
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
    cfg = tiny_pyramid_config(tmp_path)
    ckpt = _checkpoint(cfg, tmp_path)
    rng = np.random.RandomState(1)
    img = cv2.resize(
        rng.randint(0, 256, (6, 8, 3)).astype(np.uint8), (131, 97), interpolation=cv2.INTER_CUBIC
    )
    img_path = str(tmp_path / 'scene.png')
    cv2.imwrite(img_path, img)
    out = tmp_path / 'out'
    proc = run_tool(
        [
            'tools/infer_highres.py',
            cfg,
            ckpt,
            '--img',
            img_path,
            '--out-dir',
            str(out),
            '--boundary',
            'zero',
            '--dense-baseline',
        ],
        cwd=tmp_path,
    )
    base = out / 'scene_97x131_tiny_allcirc_zero'
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(
        base.name + s for s in ('.json', '_labels.png', '_mask.png', '_overlay.png')
    )

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
    palette = np.array(
        torch.load(ckpt, weights_only=False)['meta']['dataset_meta']['palette'], np.uint8
    )
    np.testing.assert_array_equal(mask[..., ::-1], palette[ref])

    rec = json.loads((out / f'{base.name}.json').read_text())
    assert (
        rec['input_size'] == [97, 131] and rec['checkpoint'] == ckpt and not rec['random_weights']
    )
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
    assert any(
        ln.startswith('scene 97x131 | CAPVT circulant-circulant-circulant-circulant')
        for ln in lines
    )
    assert 'task/s' not in proc.stderr  # no progress bar: stderr is not a terminal here


def test_unreadable_image_is_one_line_error_without_outputs(tmp_path, capsys):
    bad = tmp_path / 'broken.jpg'
    bad.write_bytes(b'\xff\xd8 truncated')
    out = tmp_path / 'out'
    cfg = osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py')
    for path in (str(bad), str(tmp_path / 'missing.png')):
        code, lines, _ = _main_in_process([cfg, '--img', path, '--out-dir', str(out)], capsys)
        assert code == 1
        assert lines == [f'error: cannot read image: {path}']
        assert not out.exists()


def test_unknown_override_is_one_line_error(tmp_path, capsys):
    cfg = osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py')
    code, lines, _ = _main_in_process(
        [cfg, '--demo', 'astronaut', '--boundary', 'wrap', '--out-dir', str(tmp_path / 'out')],
        capsys,
    )
    assert code == 1
    assert lines == ["error: --boundary must be one of ('circular', 'zero'), got 'wrap'"]
    assert not (tmp_path / 'out').exists()


def test_image_below_the_minimum_size_is_one_line_error(tmp_path, capsys):
    img = tmp_path / 'dot.png'
    cv2.imwrite(str(img), np.zeros((1, 1, 3), np.uint8))
    # CA-PVT-T's paper layout keeps SRA (sr_ratio 2) in stage 3, at stride 16: 17 px at least
    cfg = osp.join(REPO, 'configs', 'ca_pvt_t_fpn_80k_ade20k.py')
    code, lines, _ = _main_in_process(
        [cfg, '--img', str(img), '--out-dir', str(tmp_path / 'out')], capsys
    )
    assert code == 1
    assert lines == [
        'error: image dot is 1x1: ca_pvt_t_fpn_80k_ade20k needs at least 17x17 (--size 17 '
        'scales its longer side to reach it, --size HxW sets both sides)'
    ]
    assert not (tmp_path / 'out').exists()


def test_cadeit_boundary_with_progress_bar(tmp_path, capsys):
    """CA-DeiT takes --boundary; --progress shows mmengine's ProgressBar on stderr, one
    step per block (2), the neck, the head and each band of 16 of the 150 classes."""
    cfg = _isotropic_config(tmp_path, CADEIT)
    out = tmp_path / 'out'
    code, lines, _ = _main_in_process(
        [cfg, '--demo', 'astronaut', '--size', '40x56', '--boundary', 'zero', '--progress']
        + ['--out-dir', str(out)],
        capsys,
    )
    assert code == 0, lines
    base = out / 'astronaut_40x56_tiny_ca_deit_s_upernet_160k_ade20k_zero'
    rec = json.loads(base.with_suffix('.json').read_text())
    assert rec['backbone'] == dict(type='CADeiT', boundary='zero', scale='sqrt_n')
    assert cv2.imread(f'{base}_labels.png', cv2.IMREAD_UNCHANGED).shape == (40, 56)
    steps = 2 + 1 + 1 + math.ceil(150 / 16)
    # the bar's updates end in '\r', which splitlines() splits at as at '\n'
    assert sum(f'] {k}/{steps},' in part for part in lines for k in range(1, steps + 1)) == steps, (
        lines
    )


def test_veca_num_cores(tmp_path, capsys):
    cfg = _isotropic_config(tmp_path, VECA)
    out = tmp_path / 'out'
    code, lines, stdout = _main_in_process(
        [cfg, '--demo', 'astronaut', '--size', '48', '--num-cores', '8', '--out-dir', str(out)],
        capsys,
    )
    assert code == 0, lines
    rec = json.loads((out / 'astronaut_48x48_tiny_veca_b_upernet_160k_ade20k_nc8.json').read_text())
    assert rec['backbone'] == dict(type='VECAViT', num_cores=8, num_cores_max=16)
    assert rec['overrides'] == {'num_cores': 8} and rec['input_size'] == [48, 48]
    assert 'astronaut 48x48 | VECAViT C=8 |' in stdout


def _main_in_process(argv, capsys):
    """tools/infer_highres.py's main in this process (no interpreter start-up): its exit
    code, stderr lines and stdout; the tool's warning display is undone afterwards."""
    capsys.readouterr()
    with warnings.catch_warnings():
        try:
            code = infer_highres.main(argv)
        except SystemExit as exit_:  # main_guard: one error line, exit 1
            code = exit_.code
    out = capsys.readouterr()
    return code, out.err.strip().splitlines(), out.out


def test_veca_num_cores_outside_its_bank_is_one_line_error(tmp_path, capsys):
    code, lines, _ = _main_in_process(
        [
            _isotropic_config(tmp_path, VECA),
            '--demo',
            'astronaut',
            '--num-cores',
            '12',
            '--out-dir',
            str(tmp_path / 'out'),
        ],
        capsys,
    )
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(
        'error: --num-cores must be an int in [8, num_cores_max=16] and a multiple of 8'
    ) and lines[0].endswith('got 12')
    assert not (tmp_path / 'out').exists()


def test_dense_baseline_of_an_isotropic_model_is_one_line_error(tmp_path, capsys):
    code, lines, _ = _main_in_process(
        [
            _isotropic_config(tmp_path, CADEIT),
            '--demo',
            'astronaut',
            '--dense-baseline',
            '--out-dir',
            str(tmp_path / 'out'),
        ],
        capsys,
    )
    assert code == 1 and len(lines) == 1, lines
    assert (
        lines[0].startswith('error: --dense-baseline needs a pyramid backbone')
        and "'CADeiT'" in lines[0]
    )
    assert not (tmp_path / 'out').exists()


def test_compile_gives_the_labels_of_eager(tmp_path, capsys):
    """--compile (torch.compile's eager backend: the wiring, not code generation) writes
    the labels the eager run writes (the command's main in this process, dynamo's caches
    dropped afterwards)."""
    cfg = tiny_pyramid_config(tmp_path)
    ckpt = _checkpoint(cfg, tmp_path)
    labels = {}
    for name, extra in (('eager', []), ('compiled', ['--compile', 'eager'])):
        out = tmp_path / name
        try:
            code, lines, _ = _main_in_process(
                [cfg, ckpt, '--demo', 'astronaut', '--size', '96', '--out-dir', str(out), *extra],
                capsys,
            )
        finally:
            torch._dynamo.reset()
        assert code == 0, lines
        (path,) = out.glob('*_labels.png')
        labels[name] = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert len(np.unique(labels['eager'])) > 1
    np.testing.assert_array_equal(labels['compiled'], labels['eager'])


@pytest.mark.parametrize(
    'extra, text',
    [
        (['--compile', 'nope'], 'error: --compile must be a torch.compile backend such as ('),
        (['--compile', '--nproc', '2'], 'error: --compile runs in one process: not with'),
    ],
)
def test_compile_refusals_are_one_line_errors(extra, text, tmp_path, capsys):
    cfg = osp.join(REPO, 'configs', 'ca_pvt_t-allcirc_fpn_80k_ade20k.py')
    code, lines, _ = _main_in_process(
        [cfg, '--demo', 'astronaut', '--out-dir', str(tmp_path / 'o'), *extra], capsys
    )
    assert code == 1
    (line,) = lines
    assert line.startswith(text)
    assert not (tmp_path / 'o').exists()
