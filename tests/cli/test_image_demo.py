"""tools/image_demo.py (mmcirc.cli.image_demo): an image or a folder through a config and a
checkpoint, painted and written as mmdet's DetInferencer / mmseg's MMSegInferencer write
them, with their predictions (the stock Inferencers are the references); outputs that
exist, another model's checkpoint and the other library's flags are one line and write
nothing."""

import json
import os
import os.path as osp
import shutil

import numpy as np
import pytest
from PIL import Image

from helpers import FIXTURE_CONFIGS
from mmcirc.cli.image_demo import main

DET = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')
SEG = osp.join(FIXTURE_CONFIGS, 'ca_swin_upernet_tiny.py')
pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _run(argv, capsys):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return (code or 0), out.out.splitlines(), out.err.strip().splitlines()


def _images(toy_root, tmp_path, names):
    folder = tmp_path / 'images'
    folder.mkdir()
    for name in names:
        shutil.copy(toy_root / 'data' / 'toy_coco' / 'val2017' / name, folder / name)
    return folder


def test_a_folder_is_painted_with_mmdets_own_predictions(
    toy_root, tmp_path, toy_checkpoints, capsys
):
    from mmdet.apis import DetInferencer

    folder = _images(toy_root, tmp_path, ['000000000001.jpg', '000000000002.jpg'])
    (folder / 'notes.txt').write_text('not an image')
    out = tmp_path / 'out'
    code, lines, err = _run([folder, DET, toy_checkpoints['det'], '--out-dir', out], capsys)
    assert code == 0, err
    assert sorted(os.listdir(out / 'vis')) == ['000000000001.jpg', '000000000002.jpg']
    assert sorted(os.listdir(out / 'preds')) == ['000000000001.json', '000000000002.json']
    written = [ln for ln in lines if ' -> ' in ln]  # (the Inferencer's progress bar aside)
    assert len(written) == 2 and written[0].endswith(f'{out}/preds/000000000001.json'), lines
    reference = DetInferencer(model=DET, weights=toy_checkpoints['det'], device='cpu')
    for name in ('000000000001', '000000000002'):
        (ref,) = reference(str(folder / f'{name}.jpg'), no_save_vis=True)['predictions']
        got = json.loads((out / 'preds' / f'{name}.json').read_text())
        assert got['labels'] == ref['labels'] and len(got['bboxes']) > 0
        np.testing.assert_allclose(got['bboxes'], ref['bboxes'], atol=1e-3)
        np.testing.assert_allclose(got['scores'], ref['scores'], atol=1e-5)


def test_an_image_is_segmented_as_mmsegs_own_inferencer(
    toy_root, tmp_path, toy_checkpoints, capsys
):
    from mmseg.apis import MMSegInferencer

    img = toy_root / 'data/toy_ade/ADEChallengeData2016/images/validation/ADE_val_00000001.jpg'
    out = tmp_path / 'out'
    code, _, err = _run([img, SEG, '--weights', toy_checkpoints['seg'], '--out-dir', out], capsys)
    assert code == 0, err
    assert (out / 'vis' / 'ADE_val_00000001.jpg').stat().st_size > 0
    labels = np.array(Image.open(out / 'pred' / '00000000_pred.png'))
    reference = MMSegInferencer(model=SEG, weights=toy_checkpoints['seg'], device='cpu')
    expected = reference(str(img))['predictions']
    assert labels.shape == expected.shape and (labels == expected).all()


def test_an_output_that_exists_is_refused_and_kept(toy_root, tmp_path, toy_checkpoints, capsys):
    folder = _images(toy_root, tmp_path, ['000000000001.jpg'])
    kept = tmp_path / 'out' / 'preds' / '000000000001.json'
    kept.parent.mkdir(parents=True)
    kept.write_text('mine')
    code, _, err = _run(
        [folder, DET, toy_checkpoints['det'], '--out-dir', tmp_path / 'out'], capsys
    )
    assert code == 1 and err == [
        f'error: {kept} exists: give another --out-dir (nothing is overwritten)'
    ]
    assert kept.read_text() == 'mine' and os.listdir(tmp_path / 'out') == ['preds']


def test_another_models_checkpoint_is_refused_in_one_line(
    toy_root, tmp_path, toy_checkpoints, capsys
):
    folder = _images(toy_root, tmp_path, ['000000000001.jpg'])
    out = tmp_path / 'out'
    code, _, err = _run([folder, DET, toy_checkpoints['seg'], '--out-dir', out], capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f'error: checkpoint {toy_checkpoints["seg"]} does not fit the model: ')
    assert err[0].endswith('(--allow-partial-weights loads it anyway, the rest random)')
    assert not out.exists()


def test_a_flag_of_the_other_library_is_refused(toy_root, tmp_path, toy_checkpoints, capsys):
    folder = _images(toy_root, tmp_path, ['000000000001.jpg'])
    argv = [folder, DET, toy_checkpoints['det'], '--opacity', '0.5', '--out-dir', tmp_path / 'out']
    code, _, err = _run(argv, capsys)
    assert code == 1 and err == [f"error: --opacity is mmseg's; {DET} is an mmdet config"]
    assert not (tmp_path / 'out').exists()


def test_an_out_dir_that_is_a_file_is_one_line(toy_root, tmp_path, toy_checkpoints, capsys):
    folder = _images(toy_root, tmp_path, ['000000000001.jpg'])
    out = tmp_path / 'out'
    out.write_text('mine')
    code, _, err = _run([folder, DET, toy_checkpoints['det'], '--out-dir', out], capsys)
    assert code == 1 and err == [f'error: --out-dir {out} is a file, not a folder']
    assert out.read_text() == 'mine'
