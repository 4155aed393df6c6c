"""tools/analysis/{bccb_score,vis_circulant,vis_cores}.py end to end on tiny configs and
a 64 x 96 image: the files are written, the JSON agrees with the model's layout, and bad
input ends as one ``error:`` line (exit 1) with nothing written. One run goes through the
command line; the others call the commands' ``main(argv)`` (:mod:`mmcirc.cli`,
whose entry points the scripts are) in this process (the imports are shared)."""

import importlib
import json
import os.path as osp

import pytest

from helpers import FIXTURE_CONFIGS, run_tool

CA_PVT = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')  # mmdet: circulant 1-2, SRA 3-4
CA_SWIN = osp.join(FIXTURE_CONFIGS, 'ca_swin_upernet_tiny.py')  # mmseg: circulant 1-2, window 3-4
CORE_PVT = osp.join(FIXTURE_CONFIGS, 'core_pvt_cls_tiny.py')  # mmpretrain: core 1-2 (C_max 8)


def _tool(name):
    """The command behind tools/analysis/<name>.py (for in-process runs of its main)."""
    return importlib.import_module(f'mmcirc.cli.{name}')


def _only_dir(root):
    (sub,) = [p for p in root.iterdir() if p.is_dir()]
    return sub


@pytest.fixture(scope='module')
def pvt_checkpoint(tmp_path_factory):
    """A checkpoint of the tiny CA-PVT RetinaNet (weights from seed 1, not the tool's 0)."""
    import torch
    from mmdet.apis import init_detector
    from mmcirc.apis.builder import load_model_config

    cfg = load_model_config(CA_PVT)
    torch.manual_seed(1)
    model = init_detector(cfg, None, device='cpu')
    model.init_weights()
    path = tmp_path_factory.mktemp('ckpt') / 'tiny.pth'
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), path)
    return str(path)


def test_bccb_score_writes_scores_for_every_sra_layer(tmp_path, pvt_checkpoint):
    run_tool(
        [
            'tools/analysis/bccb_score.py',
            CA_PVT,
            pvt_checkpoint,
            '--demo',
            'astronaut',
            '--size',
            '64x96',
            '--out-dir',
            str(tmp_path),
        ],
        cwd=tmp_path,
        timeout=300,
    )
    out = _only_dir(tmp_path)
    assert out.name == 'ca_pvt_retinanet_tiny_astronaut_64x96'
    res = json.loads((out / 'bccb_score.json').read_text())
    # stages 3-4 are SRA: 1 block each, 1 and 2 heads; 64x96 -> 4x6 (sr 2: 2x3 keys), 2x3
    layers = res['layers']
    assert [(e['kind'], e['heads'], e['q_grid'], e['k_grid']) for e in layers] == [
        ('sra', 1, [4, 6], [2, 3]),
        ('sra', 2, [2, 3], [2, 3]),
    ]
    for e in layers:
        for key in ('distance', 'random', 'shuffled'):
            assert len(e[key]) == e['heads'] and all(0 <= v <= 1 for v in e[key]), (key, e)
        assert e['distance'] != e['random']  # the checkpoint is not the seed-0 init
    for e in layers:
        name = e['name'].replace('backbone.', '', 1)
        assert (out / f'layer_{name}.png').stat().st_size > 1000
        assert (out / f'example_{name}.png').stat().st_size > 1000
    assert (out / 'summary.png').is_file()
    assert sorted(res['outputs']) == sorted(p.name for p in out.iterdir())


def test_bccb_score_swin_windows_in_process(tmp_path, capsys):
    """mmseg config, random weights: window layers on the 2 x 2 window grid."""
    assert (
        _tool('bccb_score').main(
            [CA_SWIN, '--demo', 'astronaut', '--size', '64x64', '--out-dir', str(tmp_path)]
        )
        == 0
    )
    res = json.loads((_only_dir(tmp_path) / 'bccb_score.json').read_text())
    assert res['random_weights'] and [e['kind'] for e in res['layers']] == ['window', 'window']
    assert all(e['q_grid'] == [2, 2] and e['random'] is None for e in res['layers'])
    assert 'mean ||A - P(A)|| / ||A||' in capsys.readouterr().out


def test_vis_circulant_writes_kernels_and_erf(tmp_path):
    assert (
        _tool('vis_circulant').main(
            [
                CA_PVT,
                '--demo',
                'astronaut',
                '--size',
                '64x96',
                '--channels',
                '4',
                '--out-dir',
                str(tmp_path),
            ]
        )
        == 0
    )
    out = _only_dir(tmp_path)
    res = json.loads((out / 'vis_circulant.json').read_text())
    # stages 1-2 circulant, d = 1: 8 and 16 kernels on 16x24 and 8x12 maps
    assert [(e['heads'], e['grid'], e['kernel_shape']) for e in res['layers']] == [
        (8, [16, 24], [16, 24]),
        (16, [8, 12], [8, 12]),
    ]
    for e in res['layers']:
        assert len(e['channels']) == e['heads']
        assert all(1 <= c['effective_offsets'] <= 16 * 24 for c in e['channels'])
        assert (out / f'kernels_{e["name"].replace("backbone.", "", 1)}.png').is_file()
    assert [r['output'] for r in res['erf']] == [0, 1, 2, 3]
    assert all(0 < r['r50_px'] <= r['r90_px'] for r in res['erf'])
    assert (out / 'erf.png').stat().st_size > 1000


def test_vis_circulant_zero_boundary_overlay(tmp_path):
    """boundary='zero': kernels over the (2H-1) x (2W-1) offsets, painted on the image."""
    assert (
        _tool('vis_circulant').main(
            [
                CA_PVT,
                '--demo',
                'astronaut',
                '--size',
                '64x96',
                '--channels',
                '2',
                '--overlay',
                '--no-erf',
                '--cfg-options',
                'model.backbone.boundary=zero',
                '--out-dir',
                str(tmp_path),
            ]
        )
        == 0
    )
    out = _only_dir(tmp_path)
    res = json.loads((out / 'vis_circulant.json').read_text())
    assert [(e['boundary'], e['kernel_shape']) for e in res['layers']] == [
        ('zero', [31, 47]),
        ('zero', [15, 23]),
    ]
    assert res['erf'] == [] and not (out / 'erf.png').exists()


def test_vis_cores_writes_maps_per_core_count(tmp_path):
    assert (
        _tool('vis_cores').main(
            [
                CORE_PVT,
                '--demo',
                'astronaut',
                '--size',
                '64x96',
                '--num-cores',
                '2',
                'mobile',
                '--show',
                '2',
                '--out-dir',
                str(tmp_path),
            ]
        )
        == 0
    )
    out = _only_dir(tmp_path)
    res = json.loads((out / 'vis_cores.json').read_text())
    assert res['num_cores'] == [2, 8]
    assert [(e['grid'], e['heads']) for e in res['layers']] == [([16, 24], 1), ([8, 12], 1)]
    for e in res['layers']:
        name = e['name'].replace('backbone.', '', 1)
        for k in ('2', '8'):
            per = e['per_num_cores'][k]
            assert len(per['cores']) == int(k) and per['row_sum_error'] < 1e-5
            assert all(0 <= c['normalised_entropy'] <= 1 + 1e-5 for c in per['cores'])
            assert (out / f'cores_{name}_C{k}.png').is_file()
        assert (out / f'compare_{name}.png').is_file()
    assert (out / 'entropy.png').is_file()


# --------------------------------------------------------------------------- errors
def _error(tool, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _tool(tool).main(argv)
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: '), err
    return err[0]


def test_config_without_such_layers_is_one_line(tmp_path, capsys):
    msg = _error(
        'vis_cores',
        [CA_PVT, '--demo', 'astronaut', '--size', '64x64', '--out-dir', str(tmp_path)],
        capsys,
    )
    assert 'no core attention layer' in msg and 'circulant' in msg
    assert not any(tmp_path.iterdir())


def test_unreadable_image_is_one_line(tmp_path, capsys):
    bad = tmp_path / 'broken.jpg'
    bad.write_bytes(b'not an image')
    msg = _error(
        'vis_circulant', [CA_PVT, '--img', str(bad), '--out-dir', str(tmp_path / 'out')], capsys
    )
    assert msg == f'error: cannot read image: {bad}'
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('size', ['64x', '8x8', 'big'])
def test_bad_size_is_one_line(tmp_path, capsys, size):
    msg = _error(
        'bccb_score',
        [CA_PVT, '--demo', 'astronaut', '--size', size, '--out-dir', str(tmp_path)],
        capsys,
    )
    assert '--size' in msg and 'HxW' in msg


def test_core_count_above_the_bank_is_one_line(tmp_path, capsys):
    msg = _error(
        'vis_cores',
        [
            CORE_PVT,
            '--demo',
            'astronaut',
            '--size',
            '64x64',
            '--num-cores',
            '4',
            '16',
            '--out-dir',
            str(tmp_path),
        ],
        capsys,
    )
    assert '--num-cores must be an int in [1, num_cores_max=8]' in msg and "'16'" in msg


def test_partial_weights_are_named_in_one_warning_line(tmp_path, capsys):
    """A checkpoint of 5 classes into the 3-class config: drawn only with
    --allow-partial-weights, and then one WARNING line on stderr says so."""
    import torch

    from mmcirc.apis.builder import build_model

    five = build_model(CA_PVT, cfg_options={'model.bbox_head.num_classes': 5}, seed=1)
    ckpt = tmp_path / 'five.pth'
    torch.save(dict(state_dict=five.state_dict(), meta={}), ckpt)
    argv = [CA_PVT, str(ckpt), '--demo', 'astronaut', '--size', '64x96', '--out-dir']
    assert _tool('bccb_score').main(argv + [str(tmp_path / 'out'), '--allow-partial-weights']) == 0
    err = capsys.readouterr().err.strip().splitlines()
    warned = [ln for ln in err if 'loaded in part' in ln]
    assert len(warned) == 1 and warned[0].startswith(f'WARNING: checkpoint {ckpt} loaded in part')
    assert 'bbox_head.retina_cls.weight' in warned[0]


def test_the_plots_leave_the_users_matplotlib_backend(tmp_path):
    """The figures are drawn on canvases of their own: the process's backend stays the
    one the user chose (svg here: it needs no display)."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use('svg')
    try:
        argv = [CA_SWIN, '--demo', 'astronaut', '--size', '64x64', '--out-dir', str(tmp_path)]
        assert _tool('bccb_score').main(argv) == 0
        assert matplotlib.get_backend() == 'svg'
    finally:
        matplotlib.use(before)
    assert (_only_dir(tmp_path) / 'summary.png').read_bytes()[:4] == b'\x89PNG'
