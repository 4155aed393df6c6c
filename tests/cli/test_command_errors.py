"""One ``error:`` line (exit 1) before the work for what the commands can check first (a
config file mmengine does not read, an output folder that is a file, a size beyond the
memory, an override the model does not use), and at the failing write for what only the
write shows (a full disk: ``cannot write PATH: No space left on device``, no file left).
The commands run in this process (their ``main(argv)``)."""

import os
import os.path as osp

import cv2
import numpy as np
import pytest

from helpers import REPO, tiny_pyramid_config

TOY_SEG = osp.join(REPO, 'configs', 'toy', 'ca_pvt_t_fpn_toy_ade.py')
EXTENSIONS = '.py, .json, .yaml, .yml'


@pytest.fixture(autouse=True)
def _one_line(monkeypatch):
    monkeypatch.delenv('MMCIRC_DEBUG', raising=False)


def _error(capsys, main, argv):
    """The command's exit status and its last stderr line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    return exc.value.code, err[-1] if err else ''


@pytest.fixture
def image(tmp_path):
    path = str(tmp_path / 'img.png')
    cv2.imwrite(path, np.full((40, 60, 3), 128, np.uint8))
    return path


@pytest.fixture
def text_config(tmp_path):
    path = tmp_path / 'config.txt'
    path.write_text(open(TOY_SEG).read())
    return str(path)


def _txt_argv(command, config, tmp_path, image):
    ckpt = tmp_path / 'w.pth'
    ckpt.write_bytes(b'')
    return {
        'train': [config, '--work-dir', str(tmp_path / 'w')],
        'test': [config, str(ckpt), '--work-dir', str(tmp_path / 'w')],
        'pytorch2onnx': [config, '--shape', '64', '64', '--out', str(tmp_path / 'm.onnx')],
        'vis_circulant': [config, '--img', image, '--out-dir', str(tmp_path / 'v')],
    }[command]


@pytest.mark.parametrize('command', ['train', 'test', 'pytorch2onnx', 'vis_circulant'])
def test_a_txt_config_is_one_line(capsys, tmp_path, image, text_config, command):
    import importlib

    main = importlib.import_module(f'mmcirc.cli.{command}').main
    code, line = _error(capsys, main, _txt_argv(command, text_config, tmp_path, image))
    assert code == 1
    assert line == f'error: config {text_config}: a config must be one of {EXTENSIONS} files'


def test_a_work_dir_that_is_a_file_is_one_line(capsys, tmp_path):
    from mmcirc.cli.train import main

    (tmp_path / 'f').write_text('')
    code, line = _error(capsys, main, [TOY_SEG, '--work-dir', str(tmp_path / 'f')])
    assert (code, line) == (1, f'error: --work-dir {tmp_path}/f is a file, not a folder')


def test_an_out_dir_under_a_file_is_one_line(capsys, tmp_path, image):
    from mmcirc.cli.vis_circulant import main

    (tmp_path / 'f').write_text('')
    out = str(tmp_path / 'f' / 'sub')
    code, line = _error(capsys, main, [TOY_SEG, '--img', image, '--out-dir', out])
    assert (code, line) == (1, f'error: --out-dir {out}: {tmp_path}/f is a file, not a folder')


def test_make_toy_data_out_that_is_a_file_is_one_line(capsys, tmp_path):
    from mmcirc.cli.make_toy_data import main

    (tmp_path / 'f').write_text('')
    code, line = _error(capsys, main, ['coco', '--out', str(tmp_path / 'f')])
    assert (code, line) == (1, f'error: --out {tmp_path}/f is a file, not a folder')
    assert (tmp_path / 'f').read_text() == ''


def test_get_flops_unknown_device_is_one_line_before_the_model(capsys):
    from mmcirc.cli.get_flops import main

    code, line = _error(capsys, main, [TOY_SEG, '--device', 'bogus'])
    assert (code, line) == (1, "error: --device must be 'cpu' or 'cuda[:N]', got 'bogus'")


def test_num_cores_without_a_core_stage_is_one_line(capsys, tmp_path, image):
    from mmcirc.cli.infer_highres import main

    config = tiny_pyramid_config(tmp_path)
    argv = [config, '--img', image, '--out-dir', str(tmp_path / 'o'), '--num-cores', '16']
    code, line = _error(capsys, main, argv)
    assert code == 1 and line.startswith(
        "error: --num-cores does nothing here: CAPVT has no core stage ('circulant',"
    ), line
    assert not osp.exists(tmp_path / 'o')


def test_a_size_beyond_the_memory_is_one_line_before_the_model(capsys, tmp_path, image):
    from mmcirc.cli.infer_highres import main

    config = tiny_pyramid_config(tmp_path)
    argv = [config, '--img', image, '--out-dir', str(tmp_path / 'o'), '--size', '99999999']
    code, line = _error(capsys, main, argv)
    assert code == 1 and line.startswith(
        'error: --size 99999999: a 66666666x99999999 image and its network input take '
    ), line
    assert line.endswith('; give a smaller --size')


def test_a_full_disk_is_one_line_and_leaves_no_file(capsys, tmp_path, image, monkeypatch):
    import tempfile

    from mmcirc.cli.infer_highres import main

    if not osp.exists('/dev/full'):
        pytest.skip('no /dev/full here')
    mkstemp = tempfile.mkstemp

    def to_full(*args, **kwargs):  # writes fail as on a full disk (ENOSPC)
        fd, path = mkstemp(*args, **kwargs)
        os.close(fd)
        return os.open('/dev/full', os.O_WRONLY), path

    monkeypatch.setattr(tempfile, 'mkstemp', to_full)
    out = tmp_path / 'o'
    argv = [tiny_pyramid_config(tmp_path), '--img', image, '--out-dir', str(out)]
    argv += ['--size', '64x96', '--no-progress']
    code, line = _error(capsys, main, argv)
    stem = f'{out}/img_64x96_tiny_allcirc'
    assert (code, line) == (1, f'error: cannot write {stem}_labels.png: No space left on device')
    assert os.listdir(out) == []
