"""tools/deployment: pytorch2onnx's one-line errors and the GPU benchmark's CPU run."""

import json
import os
import os.path as osp
import runpy

import pytest

from helpers import FIXTURE_CONFIGS, REPO, run_torch_only, torch_only_origin

DET = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')
TOOL = osp.join(REPO, 'tools', 'deployment', 'pytorch2onnx.py')


@pytest.fixture(scope='module')
def export_main():
    pytest.importorskip('onnxscript', reason='pip install -r requirements.txt')
    return runpy.run_path(TOOL)['main']


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


def _benchmark_gpu_bare(args, cwd):
    return run_torch_only('tools/deployment/benchmark_gpu.py', args=args, cwd=cwd)


def test_benchmark_gpu_runs_on_cpu_with_torch_and_timm_alone(tmp_path):
    """The GPU script's code paths (eager and torch.compile, bf16 and fp32, the table)
    on the CPU at a tiny size with 2 blocks (compile with the 'eager' backend), on a
    machine like the lent GPU one: no OpenMMLab library, mmcirc not installed. The
    CA-DeiT it times is mmcirc's CADeiT (same parameters as the class built here)."""
    pytest.importorskip('timm')
    from mmcirc.models.backbones.ca_deit import CADeiT

    proc = _benchmark_gpu_bare(
        [
            '--device',
            'cpu',
            '--sizes',
            '32',
            '--batches',
            '1',
            '--depth',
            '2',
            '--repeat',
            '1',
            '--compile-backend',
            'eager',
            '--out-dir',
            str(tmp_path),
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert torch_only_origin(proc) == dict(mmcirc=osp.join(REPO, 'mmcirc', '__init__.py'), mm=[])
    res = json.loads((tmp_path / 'results_cpu.json').read_text())
    cells = res['results']
    assert set(cells) == {
        f'{m}|32|1|{p}|{mode}'
        for m in ('deit_t', 'ca_deit_t')
        for p in ('bf16', 'fp32')
        for mode in ('eager', 'compile')
    }
    assert res['skipped'] == []
    assert all(c['finite'] and c['time_ms'] > 0 and c['first_call_s'] > 0 for c in cells.values())
    ca_params = sum(p.numel() for p in CADeiT(arch=dict(embed_dims=192, depth=2)).parameters())
    C = 192  # DeiT-T: 5,717,416 published with its 1000-class head; 12 blocks of 12C^2 + 13C
    deit_params = 5_717_416 - (C * 1000 + 1000) - 10 * (12 * C * C + 13 * C)
    for key, cell in cells.items():
        assert cell['params'] == (ca_params if key.startswith('ca_') else deit_params), key
    table = (tmp_path / 'table_cpu.md').read_text()
    assert '2 blocks' in table
    for p in ('bf16', 'fp32'):
        for mode in ('eager', 'compile'):
            ca, deit = cells[f'ca_deit_t|32|1|{p}|{mode}'], cells[f'deit_t|32|1|{p}|{mode}']
            assert f'{deit["time_ms"] / ca["time_ms"]:.2f}x' in table
    assert table.count('| CA-DeiT-T |') == table.count('| DeiT-T |') == 2


@pytest.mark.parametrize(
    'args,message',
    [
        (['--device', 'cuda'], 'error: --device cuda: CUDA is not available'),
        (['--sizes', '100'], 'error: --sizes must be multiples of the patch size 16, got [100]'),
        (['--depth', '0'], 'error: --depth must be > 0, got 0'),
    ],
)
def test_benchmark_gpu_errors_are_one_line(tmp_path, args, message):
    """Bad flags and a missing GPU: one line ``error: ...`` on stderr, exit 1, no
    traceback, nothing written (also without OpenMMLab: main_guard is torch-free)."""
    import torch

    if args[:2] == ['--device', 'cuda'] and torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    proc = _benchmark_gpu_bare([*args, '--out-dir', str(tmp_path / 'out')], cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [message]
    assert not (tmp_path / 'out').exists()
