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
