"""tools/test.py takes mmdet's and mmseg's ``--show``, ``--wait-time`` and ``--tta``:
``--tta`` runs the config's tta_model over its tta_pipeline (mmseg's own tools/test.py
--tta is the reference) or, on a config without them, is one line; ``--show`` where no
window can open warns in one line and the run goes on, without waiting."""

import os.path as osp
import signal

import numpy as np
import pytest
from PIL import Image

from helpers import FIXTURE_CONFIGS, run_tool
from mmcirc.cli.test import main

DET = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')
#: the tiny UperNet on 2 validation images, with a tta_pipeline of 2 flips at half size
SEG_TTA = f"""_base_ = '{osp.join(FIXTURE_CONFIGS, 'ca_swin_upernet_tiny.py')}'
test_dataloader = dict(dataset=dict(indices=2))
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale_factor=0.5, keep_ratio=True)],
            [dict(type='RandomFlip', prob=p, direction='horizontal') for p in (0.0, 1.0)],
            [dict(type='LoadAnnotations')],
            [dict(type='PackSegInputs')],
        ],
    ),
]
"""


def test_tta_without_tta_settings_is_one_line(tmp_path, capsys):
    ckpt = tmp_path / 'any.pth'
    ckpt.write_bytes(b'')  # not read: the refusal comes first
    with pytest.raises(SystemExit) as exit_:
        main([DET, str(ckpt), '--tta', '--work-dir', str(tmp_path / 'w')])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and err == [
        f'error: --tta: {DET} has no tta_model and no tta_pipeline (the test-time '
        "augmentation to run: as in mmdet's *_tta.py configs)"
    ]
    assert not (tmp_path / 'w').exists()


def test_tta_labels_are_those_of_mmsegs_own_test_tool(
    toy_root, tmp_path, toy_checkpoints, monkeypatch
):
    cfg = tmp_path / 'seg_tta.py'
    cfg.write_text(SEG_TTA)
    ours, theirs = tmp_path / 'ours', tmp_path / 'theirs'
    args = [str(cfg), toy_checkpoints['seg'], '--tta', '--out']
    monkeypatch.chdir(toy_root)
    main([*args, str(ours), '--work-dir', str(tmp_path / 'w1')])
    import mmseg

    mmseg_test = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'test.py')
    run_tool([mmseg_test, *args, str(theirs), '--work-dir', str(tmp_path / 'w2')], toy_root)
    names = sorted(p.name for p in theirs.iterdir())
    assert names == ['ADE_val_00000001.png', 'ADE_val_00000002.png']
    assert sorted(p.name for p in ours.iterdir()) == names
    for name in names:
        a, b = (np.array(Image.open(folder / name)) for folder in (ours, theirs))
        assert a.shape == b.shape and (a == b).all(), name


def _stuck(signum, frame):
    raise TimeoutError('tools/test.py --show waited for a window that cannot open')


def test_show_without_a_display_warns_and_does_not_wait(
    toy_root, tmp_path, toy_checkpoints, monkeypatch, capsys
):
    """mmengine's visualizer waits for a key on Agg with --wait-time 0 (forever): a run
    that waits fails on the alarm."""
    import matplotlib

    assert matplotlib.get_backend().lower() == 'agg'  # no display here
    work = tmp_path / 'w'
    monkeypatch.chdir(toy_root)
    signal.signal(signal.SIGALRM, _stuck)
    signal.alarm(300)
    try:
        main([DET, toy_checkpoints['det'], '--show', '--wait-time', '0', '--show-dir', 'vis']
             + ['--work-dir', str(work), '--cfg-options', 'test_dataloader.dataset.indices=2'])  # fmt: skip
    finally:
        signal.alarm(0)
    warned = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith('WARNING: --sh')]
    assert warned == [
        "WARNING: --show: matplotlib's backend agg opens no window (no display?); nothing "
        'is shown (--show-dir DIR saves the pictures)'
    ]
    assert len(list(work.glob('*/vis/*.jpg'))) == 2  # the 2 test images, painted


def test_show_is_its_own_flag_not_show_dir():
    from mmcirc.cli.test import parse_args

    args = parse_args([DET, 'x.pth', '--show'])
    assert args.show is True and args.show_dir is None and args.wait_time == 2
