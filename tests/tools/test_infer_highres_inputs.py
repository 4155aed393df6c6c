"""tools/infer_highres.py given what a user gets wrong: a checkpoint that does not fit
the config (refused in one line, loaded in part only with --allow-partial-weights and
then recorded as random), files that are no checkpoint or config, a malicious pickle,
an --out-dir that is a file, two images of one name (distinct outputs), an image too
small for the config (advice that reaches the minimum). The tool's main runs in this
process (tests/tools/test_infer_highres.py has the end-to-end runs)."""

import json
import os
import os.path as osp
import pickle
import warnings

import cv2
import numpy as np
import pytest
import torch

from helpers import tiny_pyramid_config
from mmcirc.cli import infer_highres


def _main(argv, capsys):
    """(exit code, stdout lines, stderr lines) of the tool's main in this process."""
    with warnings.catch_warnings():
        try:
            code = infer_highres.main(argv)
        except SystemExit as exit_:
            code = exit_.code
    out = capsys.readouterr()
    return code, out.out.strip().splitlines(), out.err.strip().splitlines()


def _errors(lines):
    return [ln for ln in lines if ln.startswith('error:')]


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """(config, its checkpoint, a 5-class checkpoint of the same model, folder)."""
    from mmengine.config import Config

    from mmcirc.apis import build_model

    tmp = tmp_path_factory.mktemp('highres_inputs')
    cfg = tiny_pyramid_config(tmp)
    ckpt = tmp / 'tiny.pth'
    torch.save(dict(state_dict=build_model(cfg, seed=0).state_dict()), ckpt)
    five = Config.fromfile(cfg)
    five.model.decode_head.num_classes = 5
    other = tmp / 'five_classes.pth'
    torch.save(dict(state_dict=build_model(five, seed=0).state_dict()), other)
    return cfg, str(ckpt), str(other), tmp


def _image(path, h=40, w=56):
    os.makedirs(osp.dirname(path), exist_ok=True)
    cv2.imwrite(str(path), np.random.RandomState(0).randint(0, 256, (h, w, 3)).astype(np.uint8))
    return str(path)


def test_a_checkpoint_of_another_class_count_is_refused_in_one_line(tiny, capsys):
    cfg, _, other, tmp = tiny
    out = tmp / 'refused'
    code, _, err = _main([cfg, other, '--demo', 'astronaut', '--size', '32',
                          '--out-dir', str(out)], capsys)  # fmt: skip
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f'error: checkpoint {other} does not fit the model: ')
    assert 'decode_head.conv_seg.weight: checkpoint (5, 8, 1, 1), model (150, 8, 1, 1)' in err[0]
    assert err[0].endswith('(--allow-partial-weights loads it anyway, the rest random)')
    assert not out.exists()


def test_partial_weights_are_recorded_as_random(tiny, capsys):
    cfg, _, other, tmp = tiny
    out = tmp / 'partial'
    code, _, err = _main([cfg, other, '--demo', 'astronaut', '--size', '32',
                          '--allow-partial-weights', '--out-dir', str(out)], capsys)  # fmt: skip
    assert code == 0, err
    (js,) = [p for p in os.listdir(out) if p.endswith('.json')]
    assert json.loads((out / js).read_text())['random_weights'] is True


@pytest.mark.parametrize('kind', ['empty', 'text', 'truncated'])
def test_a_file_that_is_no_checkpoint_is_one_line(tiny, capsys, kind):
    cfg, ckpt, _, tmp = tiny
    bad = tmp / f'{kind}.pth'
    data = open(ckpt, 'rb').read()
    bad.write_bytes(
        dict(empty=b'', text=b'see the README\n', truncated=data[: len(data) // 2])[kind]
    )
    code, _, err = _main([cfg, str(bad), '--demo', 'astronaut', '--size', '32',
                          '--out-dir', str(tmp / kind)], capsys)  # fmt: skip
    assert code == 1 and len(err) == 1 and str(bad) in err[0], err
    assert not (tmp / kind).exists()


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


@pytest.mark.parametrize('kind', ['zip', 'legacy', 'plain'])
def test_a_malicious_pickle_is_refused_naming_this_tools_flag(tiny, capsys, kind):
    cfg, _, _, tmp = tiny
    path, marker = tmp / f'evil_{kind}.pth', tmp / f'ran_{kind}'
    payload = {'state_dict': {}, 'x': _RunsCode(marker)}
    if kind == 'plain':
        path.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, path, _use_new_zipfile_serialization=kind == 'zip')
    code, _, err = _main([cfg, str(path), '--demo', 'astronaut', '--size', '32',
                          '--out-dir', str(tmp / 'evil')], capsys)  # fmt: skip
    assert not marker.exists()
    errors = _errors(err)
    assert code == 1 and len(errors) == 1 and 'system' in errors[0], err
    assert errors[0].endswith('pass --trust-checkpoint') and 'tools/test.py' not in errors[0]
    assert 'weights_only' not in errors[0]


def test_a_config_of_another_kind_is_one_line(tiny, capsys):
    cfg, _, _, tmp = tiny
    other = tmp / 'tiny.cfg'
    other.write_text(open(cfg).read())
    code, _, err = _main([str(other), '--demo', 'astronaut'], capsys)
    assert code == 1 and err == [
        f'error: config {other}: a config must be one of .py, .json, .yaml, .yml files'
    ]


def test_an_out_dir_that_is_a_file_is_refused_before_any_work(tiny, capsys, monkeypatch):
    cfg, _, _, tmp = tiny
    taken = tmp / 'taken'
    taken.write_text('mine')
    monkeypatch.setattr(
        infer_highres.imio, 'load_images', lambda *a: pytest.fail('read images before checking')
    )
    code, _, err = _main([cfg, '--demo', 'astronaut', '--out-dir', str(taken)], capsys)
    assert code == 1 and err == [f'error: --out-dir {taken} is a file, not a folder']
    assert taken.read_text() == 'mine'


def test_two_images_of_one_name_write_distinct_outputs(tiny, capsys):
    cfg, _, _, tmp = tiny
    a, b = _image(tmp / 'in' / 'a' / 'x.png'), _image(tmp / 'in' / 'b' / 'x.png', 48, 40)
    out = tmp / 'same_name'
    code, lines, err = _main([cfg, '--img', a, b, '--out-dir', str(out)], capsys)
    assert code == 0, err
    wrote = [ln.rsplit(' | ', 1)[1] for ln in lines if ln.endswith('_overlay.png')]
    assert wrote == [f'{out}/a/x_40x56_tiny_allcirc_overlay.png',
                     f'{out}/b/x_48x40_tiny_allcirc_overlay.png']  # fmt: skip
    for path, src in zip(wrote, (a, b)):
        rec = json.loads(open(path.replace('_overlay.png', '.json')).read())
        assert rec['image'] == src
        assert cv2.imread(path).shape[:2] == cv2.imread(src).shape[:2]


def test_the_same_image_twice_is_refused_naming_both(tiny, capsys):
    cfg, _, _, tmp = tiny
    a = _image(tmp / 'twice' / 'x.png')
    code, _, err = _main([cfg, '--img', a, a, '--out-dir', str(tmp / 'twice_out')], capsys)
    assert code == 1 and len(err) == 1 and err[0].count(a) == 2, err
    assert not (tmp / 'twice_out').exists()


def test_the_size_advice_for_a_thin_image_reaches_the_minimum(tmp_path, capsys):
    """7 x 1500 under CA-PVT-T's paper layout (SRA in stage 3): the advised --size S
    (the longer side) is the smallest whose resize (the tool's own) reaches the minimum."""
    from mmcirc import apis
    from mmcirc.cli.image_io import resize_image

    cfg = tiny_pyramid_config(tmp_path, 'ca_pvt_t_fpn_80k_ade20k.py', 'tiny_sra')
    img = _image(tmp_path / 'thin.png', 7, 1500)
    code, _, err = _main([cfg, '--img', img, '--out-dir', str(tmp_path / 'out')], capsys)
    minimum = apis.min_input_size(apis.load_highres_config(cfg))
    assert code == 1 and len(err) == 1, err
    assert f'needs at least {minimum}x{minimum} (--size ' in err[0]
    advised = int(err[0].split('(--size ')[1].split()[0])
    thin = np.zeros((7, 1500, 3), np.uint8)
    assert min(resize_image(thin, advised).shape[:2]) >= minimum
    assert min(resize_image(thin, advised - 1).shape[:2]) < minimum


def test_the_advice_for_a_size_out_of_reach_is_an_exact_size(tmp_path, capsys):
    cfg = tiny_pyramid_config(tmp_path, 'ca_pvt_t_fpn_80k_ade20k.py', 'tiny_sra')
    img = _image(tmp_path / 'line.png', 1, 4000)
    code, _, err = _main([cfg, '--img', img, '--out-dir', str(tmp_path / 'out')], capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].endswith('(--size HxW with both sides >= 17 stretches it to fit)')
