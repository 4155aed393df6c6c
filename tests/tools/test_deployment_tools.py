"""tools/deployment: pytorch2onnx's one-line errors (the GPU benchmark:
tests/benchmark/test_bench_command.py)."""

import os
import os.path as osp

import pytest

from helpers import FIXTURE_CONFIGS

DET = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')


@pytest.fixture(scope='module')
def export_main():
    pytest.importorskip('onnxscript', reason='pip install -r requirements.txt')
    from mmcirc.cli.pytorch2onnx import main

    return main


def _run(main, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return exc.value.code, err


def test_missing_checkpoint_is_one_line_and_writes_nothing(tmp_path, export_main, capsys):
    out = tmp_path / 'm.onnx'
    code, err = _run(
        export_main,
        [DET, str(tmp_path / 'nope.pth'), '--shape', '64', '96', '--out', str(out)],
        capsys,
    )
    assert code == 1 and err == [f'error: checkpoint file not found: {tmp_path / "nope.pth"}']
    assert os.listdir(tmp_path) == []


def test_shape_too_small_is_one_line_and_writes_nothing(tmp_path, export_main, capsys):
    code, err = _run(
        export_main, [DET, '--shape', '8', '96', '--out', str(tmp_path / 'm.onnx')], capsys
    )
    assert code == 1 and len(err) == 1 and err[0].startswith('error: shape 8x96')
    assert os.listdir(tmp_path) == []


def test_dynamic_shape_must_follow_the_size_divisor(tmp_path, export_main, capsys):
    code, err = _run(
        export_main,
        [DET, '--shape', '64', '100', '--dynamic', '--out', str(tmp_path / 'm.onnx')],
        capsys,
    )
    assert code == 1 and err == [
        'error: shape 64x100: a dynamic graph takes H and W that are '
        'multiples of size_divisor=32 (the total stride); pick such a '
        'shape'
    ]
    assert os.listdir(tmp_path) == []


def test_chunked_core_gather_names_layer_and_option(tmp_path, export_main, capsys):
    code, err = _run(
        export_main,
        [
            DET,
            '--shape',
            '64',
            '96',
            '--dynamic',
            '--out',
            str(tmp_path / 'm.onnx'),
            '--cfg-options',
            'model.backbone.stage_attentions=[core,core,sra,sra]',
            'model.backbone.core_chunk_size=16',
        ],
        capsys,
    )
    assert code == 1 and len(err) == 1
    assert err[0].startswith(
        'error: layer backbone.layers.0.blocks.0.attn (CoreAttention, chunk_size=16)'
    )
    assert 'core_chunk_size=None' in err[0]
    assert os.listdir(tmp_path) == []


def test_dynamic_swin_window_stage_is_one_line_and_writes_nothing(tmp_path, export_main, capsys):
    swin = osp.join(FIXTURE_CONFIGS, 'ca_swin_upernet_tiny.py')
    code, err = _run(
        export_main,
        [swin, '--shape', '64', '96', '--dynamic', '--out', str(tmp_path / 'm.onnx')],
        capsys,
    )
    assert code == 1 and len(err) == 1
    assert err[0].startswith('error: layer backbone.stages.2.blocks.0 (WindowBlock in stage 3, ')
    assert 'without --dynamic' in err[0] and 'model.backbone.stage_attentions' in err[0]
    assert os.listdir(tmp_path) == []


def test_out_must_be_onnx(tmp_path, export_main, capsys):
    code, err = _run(
        export_main, [DET, '--shape', '64', '96', '--out', str(tmp_path / 'm.pt')], capsys
    )
    assert code == 1 and err == [f'error: --out must name a .onnx file, got {tmp_path / "m.pt"}']


@pytest.fixture(scope='module')
def partial_export(tmp_path_factory, export_main):
    """pytorch2onnx with a checkpoint of 5 classes into the 3-class config, loaded in
    part (``--allow-partial-weights``), under umask 022: (exit code, stderr lines, file)."""
    import subprocess
    import sys

    import torch

    from helpers import REPO
    from mmcirc.apis.builder import build_model

    root = tmp_path_factory.mktemp('partial')
    five = build_model(DET, cfg_options={'model.bbox_head.num_classes': 5}, seed=0)
    ckpt = root / 'five.pth'
    torch.save(dict(state_dict=five.state_dict(), meta={}), ckpt)
    out = root / 'm.onnx'
    argv = [DET, str(ckpt), '--shape', '64', '96', '--out', str(out), '--allow-partial-weights']
    code = (
        f'import os, sys; os.umask(0o022); from mmcirc.cli.pytorch2onnx import main; main({argv!r})'
    )
    proc = subprocess.run(
        [sys.executable, '-c', code],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='2'),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stderr.strip().splitlines(), out, str(ckpt)


def test_partial_weights_export_warns_in_one_line(partial_export):
    code, err, _, ckpt = partial_export
    assert code == 0, err[-20:]
    warned = [ln for ln in err if 'loaded in part' in ln]
    assert len(warned) == 1 and warned[0].startswith(f'WARNING: checkpoint {ckpt} loaded in part')
    assert 'bbox_head.retina_cls.weight: checkpoint (45, ' in warned[0]


def test_the_onnx_file_gets_the_umasks_mode(partial_export):
    code, err, out, _ = partial_export
    assert code == 0, err[-20:]
    assert os.stat(out).st_mode & 0o777 == 0o644
