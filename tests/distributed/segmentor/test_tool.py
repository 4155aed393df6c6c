"""tools/infer_highres.py sharded (--nproc P, torchrun --shard) against its own
single-process run with the same checkpoint: identical label maps, the same files, a
JSON with every rank's figures; bad input is one error line and leaves no file."""

import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from helpers import REPO, run_tool

from .test_model import CA_PVT, PVT

SIZE = '70x100'


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    """(config, checkpoint, cwd) of a tiny CA-PVT FPN with circulant, core and sra stages."""
    from mmcirc.apis.builder import build_model

    tmp = tmp_path_factory.mktemp('shard_tool')
    cfg = tmp / 'tiny_pvt.py'
    extra = ", stage_attentions=('circulant', 'core', 'sra', 'circulant')"
    cfg.write_text(PVT.format(base=osp.join(REPO, 'configs', CA_PVT), extra=extra))
    model = build_model(str(cfg), seed=0)
    ckpt = tmp / 'tiny.pth'
    torch.save({'state_dict': model.state_dict()}, ckpt)
    return str(cfg), str(ckpt), tmp


def _labels(out_dir):
    from PIL import Image

    (path,) = [p for p in os.listdir(out_dir) if p.endswith('_labels.png')]
    return np.array(Image.open(osp.join(out_dir, path)))


def _run(setup, out, *extra):
    cfg, ckpt, tmp = setup
    args = ['tools/infer_highres.py', cfg, ckpt, '--demo', 'astronaut', '--size', SIZE]
    return run_tool([*args, '--out-dir', str(tmp / out), *extra], cwd=tmp)


def _main(argv, capfd):
    """tools/infer_highres.py's main (the door's) run in this process, its ``--nproc``
    ranks forked from it: a CompletedProcess of its exit code and of what it and its
    ranks wrote to stdout and stderr (captured at the file descriptors); the tool's
    warning display is undone afterwards."""
    from mmcirc.cli import infer_highres

    capfd.readouterr()
    with warnings.catch_warnings():
        try:
            code = infer_highres.main(argv)
        except SystemExit as exit_:  # main_guard: one error line, exit 1
            code = exit_.code
    out = capfd.readouterr()
    return subprocess.CompletedProcess(argv, code, out.out, out.err)


def _main_run(setup, out, *extra, capfd):
    """:func:`_run`'s arguments through :func:`_main`."""
    cfg, ckpt, tmp = setup
    args = [cfg, ckpt, '--demo', 'astronaut', '--size', SIZE, '--out-dir', str(tmp / out)]
    return _main([*args, *extra], capfd)


@pytest.fixture(scope='module')
def single(setup):
    _run(setup, 'single')
    return _labels(setup[2] / 'single')


def test_nproc_3_same_labels_and_files_as_one_process(setup, single):
    _run(setup, 'nproc3', '--nproc', '3')
    out = setup[2] / 'nproc3'
    assert np.array_equal(_labels(out), single)
    names = sorted(p.replace('nproc3', '') for p in os.listdir(out))
    assert names == sorted(os.listdir(setup[2] / 'single'))
    (js,) = [p for p in os.listdir(out) if p.endswith('.json')]
    rec = json.load(open(out / js))
    assert rec['world_size'] == 3 and [r['rank'] for r in rec['per_rank']] == [0, 1, 2]
    assert all(r['peak_rss_mb'] > 0 and r['bytes_sent']['total'] > 0 for r in rec['per_rank'])
    assert rec['time_s'] == max(r['time_s'] for r in rec['per_rank'])


@pytest.mark.skipif(
    shutil.which('torchrun', path=osp.dirname(sys.executable)) is None, reason='no torchrun'
)
def test_torchrun_shard_same_labels(setup, single):
    cfg, ckpt, tmp = setup
    torchrun = osp.join(osp.dirname(sys.executable), 'torchrun')
    cmd = [
        torchrun, '--nproc-per-node', '2', '--master-port', str(_port()),
        osp.join(REPO, 'tools', 'infer_highres.py'), cfg, ckpt, '--demo', 'astronaut',
        '--size', SIZE, '--shard', '--out-dir', str(tmp / 'torchrun2'),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO)
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert np.array_equal(_labels(tmp / 'torchrun2'), single)


def _port():
    from mmcirc.distributed import free_port

    return free_port()


def test_swin_window_config_is_one_error_line_and_no_file(setup, capfd):
    cfg = osp.join(REPO, 'tests', 'fixtures', 'configs', 'ca_swin_upernet_tiny.py')
    tmp = setup[2]
    proc = _main(
        [
            cfg,
            '--demo',
            'astronaut',
            '--size',
            '64',
            '--nproc',
            '2',
            '--out-dir',
            str(tmp / 'swin'),
        ],
        capfd,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith('error:')]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    assert "shifted-window attention ('window')" in errors[0] and 'stage_attentions' in errors[0]
    assert not (tmp / 'swin').exists()


def test_too_many_ranks_is_one_error_line_naming_the_largest_p(setup, capfd):
    proc = _main_run(setup, 'nproc4', '--nproc', '4', capfd=capfd)
    errors = [line for line in proc.stderr.splitlines() if line.startswith('error:')]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    assert '3 rows of the smallest feature map' in errors[0]
    assert 'largest usable number of processes is 3' in errors[0]
    assert not (setup[2] / 'nproc4').exists()


def test_a_rank_failing_mid_inference_stops_all_with_one_line_and_no_file(
    setup, capfd, monkeypatch
):
    import torch.distributed as dist

    import mmcirc.distributed.segmentor.model as pm

    band_labels = pm.band_labels

    def failing_on_rank_1(*args, **kwargs):  # the ranks are forked: they see it
        if dist.get_rank() == 1:
            raise RuntimeError('injected failure on rank 1')
        return band_labels(*args, **kwargs)

    monkeypatch.setattr(pm, 'band_labels', failing_on_rank_1)
    proc = _main_run(setup, 'failing', '--nproc', '2', capfd=capfd)
    errors = [line for line in proc.stderr.splitlines() if line.startswith('error:')]
    assert proc.returncode == 1 and errors == [
        'error: rank 1 failed: RuntimeError: injected failure on rank 1'
    ], proc.stderr
    assert not (setup[2] / 'failing').exists()


DANET = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 1])),
    neck=None,
    decode_head=dict(_delete_=True, type='DAHead', in_channels=32, in_index=3, channels=8,
                     pam_channels=4, num_classes=150))
"""


def test_danet_head_labels_in_one_process_and_one_error_line_sharded(setup, capsys):
    """DAHead's forward returns three maps (its predict takes the first): one process
    writes the labels, sharded its position attention is refused in one line naming
    the module and the op, and nothing is written (the tool's main in this process)."""
    from mmcirc.cli import infer_highres

    tmp = setup[2]
    cfg = tmp / 'danet.py'
    cfg.write_text(DANET.format(base=osp.join(REPO, 'configs', CA_PVT)))
    args = [str(cfg), '--demo', 'astronaut', '--size', '517x389']
    with warnings.catch_warnings():
        assert infer_highres.main([*args, '--out-dir', str(tmp / 'danet1')]) == 0
        assert _labels(tmp / 'danet1').shape == (517, 389)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            infer_highres.main([*args, '--nproc', '2', '--out-dir', str(tmp / 'danet2')])
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith('error:')]
    assert exit_.value.code == 1 and len(errors) == 1, lines
    assert re.search(r'decode_head\.pam\S*: sharded inference: \S+ has no handler', errors[0])
    assert not any('Traceback' in line for line in lines) and not (tmp / 'danet2').exists()


def test_two_images_of_one_name_write_distinct_outputs_sharded(setup, capfd):
    cfg, ckpt, tmp = setup
    paths = []
    for sub, (h, w) in (('a', (64, 72)), ('b', (72, 64))):
        os.makedirs(tmp / 'same' / sub, exist_ok=True)
        paths.append(str(tmp / 'same' / sub / 'x.png'))
        cv2_img = np.random.RandomState(0).randint(0, 256, (h, w, 3)).astype(np.uint8)
        from PIL import Image

        Image.fromarray(cv2_img).save(paths[-1])
    out = tmp / 'same_out'
    proc = _main([cfg, ckpt, '--img', *paths, '--nproc', '2', '--out-dir', str(out)], capfd)
    assert proc.returncode == 0, proc.stderr
    wrote = [ln.rsplit(' | ', 1)[1] for ln in proc.stdout.splitlines() if ln.endswith('.png')]
    assert wrote == [
        f'{out}/a/x_64x72_tiny_pvt_overlay.png',
        f'{out}/b/x_72x64_tiny_pvt_overlay.png',
    ]
    assert all(osp.isfile(p) for p in wrote)


def test_a_checkpoint_that_does_not_fit_is_one_error_line_sharded(setup, capfd):
    cfg, ckpt, tmp = setup
    state = torch.load(ckpt)['state_dict']
    del state['decode_head.conv_seg.bias']
    torch.save({'state_dict': state}, tmp / 'no_bias.pth')
    proc = _main(
        [cfg, str(tmp / 'no_bias.pth'), '--demo', 'astronaut', '--size', SIZE, '--nproc', '2',
         '--out-dir', str(tmp / 'no_bias')],
        capfd,
    )  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith('error:')]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    assert (
        '1 missing (decode_head.conv_seg.bias)' in errors[0]
        and '--allow-partial-weights' in (errors[0])
    )
    assert not (tmp / 'no_bias').exists()


def test_groups_of_two_ranks_predict_three_images_as_one_process(setup, capfd):
    """--nproc 4 --shard-size 2: two groups of two ranks, images 1 and 3 in one, 2 in the
    other; every image's labels equal one process's, the lines in the images' order;
    a shard size that does not divide --nproc is one error line before any rank starts."""
    from PIL import Image

    cfg, ckpt, tmp = setup
    paths = []
    for k, (h, w) in enumerate([(64, 72), (72, 64), (70, 70)]):
        paths.append(str(tmp / f'im{k}.png'))
        Image.fromarray(np.random.RandomState(k).randint(0, 256, (h, w, 3)).astype(np.uint8)).save(
            paths[-1]
        )
    outs = {}
    for name, extra in (('one3', []), ('mesh3', ['--nproc', '4', '--shard-size', '2'])):
        proc = _main([cfg, ckpt, '--img', *paths, *extra, '--out-dir', str(tmp / name)], capfd)
        assert proc.returncode == 0, proc.stderr
        outs[name] = [ln.split(' | ')[0] for ln in proc.stdout.splitlines() if ' | ' in ln]
    assert outs['mesh3'] == outs['one3'] == ['im0 64x72', 'im1 72x64', 'im2 70x70']
    for k in range(3):
        stem = f'im{k}_{outs["one3"][k].split()[1]}_tiny_pvt_labels.png'
        one = np.array(Image.open(tmp / 'one3' / stem))
        assert np.array_equal(np.array(Image.open(tmp / 'mesh3' / stem)), one), stem
    rec = json.load(open(tmp / 'mesh3' / 'im1_72x64_tiny_pvt.json'))
    assert rec['world_size'] == 2 and [r['rank'] for r in rec['per_rank']] == [0, 1]
    proc = _main_run(setup, 'mesh_bad', '--nproc', '4', '--shard-size', '3', capfd=capfd)
    assert proc.returncode == 1
    assert (
        proc.stderr.strip().splitlines()[-1] == 'error: --shard-size must divide --nproc 4, got 3'
    )
