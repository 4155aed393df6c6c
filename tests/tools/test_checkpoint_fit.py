"""tools/test.py and tools/train.py with weights that do not fit, files that are no
checkpoint, and a work dir in use: one ``error:`` line (exit 1) before anything is
scored or trained, or (``--allow-partial-weights``) a score with one warning line. The
commands' ``main`` run in this process on the toy COCO data (mmdet's RetinaNet, tiny);
the checkpoints are the config's model with other shapes, written here."""

import os.path as osp

import pytest
import torch

from helpers import FIXTURE_CONFIGS
from mmcirc.apis import build_model
from mmcirc.cli import test as test_cli
from mmcirc.cli import train as train_cli
from mmcirc.engine import WorkDirLock

pytestmark = pytest.mark.usefixtures('one_torch_thread')

CONFIG = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')  # 4 iterations, 3 classes
OTHER = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')  # another backbone (CA-PVT)
CLS = 'bbox_head.retina_cls.weight'


def _save(model, path, **meta):
    torch.save(dict(state_dict=model.state_dict(), meta=meta), path)
    return str(path)


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    """The config's model (``fits``), the same with 5 classes instead of 3 (``five``)
    and a CA-PVT RetinaNet (``other``), random weights, saved."""
    root = tmp_path_factory.mktemp('fit')
    model = build_model(CONFIG, seed=0)
    five = build_model(CONFIG, cfg_options={'model.bbox_head.num_classes': 5}, seed=0)
    other = build_model(OTHER, seed=0, init_weights=False)
    return dict(
        model=model,
        fits=_save(model, root / 'fits.pth'),
        five=_save(five, root / 'five.pth'),
        other=_save(other, root / 'other.pth'),
    )


def _error_line(proc):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines and lines[-1].startswith('error: '), proc.stderr
    assert 'Traceback' not in proc.stderr
    return lines[-1]


def _shape(model, key, classes):
    shape = tuple(model.state_dict()[key].shape)
    return (classes * shape[0] // 3, *shape[1:])


def test_testing_another_class_count_is_refused_before_scoring(
    run_main, toy_root, tmp_path, checkpoints
):
    proc = run_main(
        test_cli.main, [CONFIG, checkpoints['five'], '--work-dir', str(tmp_path)], toy_root
    )
    line = _error_line(proc)
    model = checkpoints['model']
    full, five = tuple(model.state_dict()[CLS].shape), _shape(model, CLS, 5)
    assert line.startswith(f'error: checkpoint {checkpoints["five"]} does not fit the model: ')
    assert f'{CLS}: checkpoint {five}, model {full}' in line
    assert line.endswith('(--allow-partial-weights loads it anyway, the rest random)')
    assert 'bbox_mAP' not in proc.stdout


def test_testing_with_partial_weights_scores_and_warns_on_stderr(
    run_main, toy_root, tmp_path, checkpoints
):
    proc = run_main(
        test_cli.main,
        [CONFIG, checkpoints['five'], '--work-dir', str(tmp_path), '--allow-partial-weights'],
        toy_root,
    )
    assert isinstance(proc.returncode, dict), proc.stderr  # main returns the metrics
    warned = [ln for ln in proc.stderr.splitlines() if 'loaded in part' in ln]
    assert len(warned) == 1 and warned[0].startswith(f'WARNING: checkpoint {checkpoints["five"]}')
    assert CLS in warned[0] and 'bbox_mAP' in proc.stdout


def test_testing_a_truncated_checkpoint_says_truncated(run_main, toy_root, tmp_path, checkpoints):
    cut = tmp_path / 'cut.pth'
    data = open(checkpoints['fits'], 'rb').read()
    cut.write_bytes(data[: len(data) // 2])
    proc = run_main(test_cli.main, [CONFIG, str(cut), '--work-dir', str(tmp_path)], toy_root)
    assert _error_line(proc).startswith(f'error: cannot read {cut}: truncated (')


def test_training_from_another_models_checkpoint_is_refused(
    run_main, toy_root, tmp_path, checkpoints
):
    argv = [
        CONFIG,
        '--work-dir',
        str(tmp_path),
        '--cfg-options',
        f'load_from={checkpoints["other"]}',
    ]
    line = _error_line(run_main(train_cli.main, argv, toy_root))
    assert line.startswith(
        f"error: checkpoint {checkpoints['other']} does not fit the config's backbone"
    )
    assert 'missing (backbone.' in line
    assert not list(tmp_path.glob('iter_*.pth'))


def test_resuming_into_a_changed_model_names_the_first_key(
    run_main, toy_root, tmp_path, checkpoints
):
    _save(checkpoints['model'], tmp_path / 'iter_2.pth', epoch=0, iter=2)
    argv = [CONFIG, '--work-dir', str(tmp_path), '--resume']
    argv += ['--cfg-options', 'model.bbox_head.num_classes=7']
    line = _error_line(run_main(train_cli.main, argv, toy_root))
    assert line.startswith(f'error: checkpoint {tmp_path / "iter_2.pth"} does not fit the model')
    assert f'{CLS}: checkpoint {tuple(checkpoints["model"].state_dict()[CLS].shape)}' in line
    assert not (tmp_path / 'iter_4.pth').exists()


def test_resuming_with_nothing_left_to_train_is_refused(run_main, toy_root, tmp_path, checkpoints):
    _save(checkpoints['model'], tmp_path / 'iter_4.pth', epoch=0, iter=4)
    proc = run_main(train_cli.main, [CONFIG, '--work-dir', str(tmp_path), '--resume'], toy_root)
    assert _error_line(proc) == (
        f'error: nothing left to train: checkpoint {tmp_path / "iter_4.pth"} is at iteration 4 '
        'and train_cfg.max_iters is 4; raise train_cfg.max_iters to train on'
    )


def test_training_into_a_work_dir_in_use_is_refused(run_main, toy_root, tmp_path):
    with WorkDirLock(str(tmp_path)) as held:
        proc = run_main(train_cli.main, [CONFIG, '--work-dir', str(tmp_path)], toy_root)
        line = _error_line(proc)
        assert held.fd is not None
    assert line.startswith(f'error: work dir {tmp_path} is in use by another training run (pid ')
    assert sorted(p.name for p in tmp_path.iterdir()) == []
