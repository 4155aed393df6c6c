"""mmcirc.cli.common.main_guard: a bad config value is one ``error:`` line (exit 1) in every
tool, the traceback only with MMCIRC_DEBUG=1."""

import pytest

from helpers import REPO, run_tool
from mmcirc.cli.common import error_line, main_guard

RETINANET = 'configs/toy/ca_pvt_t_retinanet_toy.py'
BAD_ATTENTIONS = "model.backbone.stage_attentions=('circulant','bogus','sra','sra')"


def _mmengine_build_error():
    """The error mmengine's registry raises for a bad backbone argument."""
    import mmcirc  # noqa: F401
    from mmengine.config import Config
    from mmengine.registry import DefaultScope, init_default_scope

    cfg = Config.fromfile(f'{REPO}/{RETINANET}')
    cfg.merge_from_dict({'model.backbone.stage_attentions': ('circulant', 'bogus', 'sra', 'sra')})
    init_default_scope('mmdet')
    from mmdet.registry import MODELS

    try:
        with pytest.raises(ValueError) as exc:
            MODELS.build(cfg.model)
    finally:
        DefaultScope._instance_dict.pop('mmdet', None)
    return exc.value


def test_registry_build_error_is_the_backbone_message():
    line = error_line(_mmengine_build_error())
    assert line.startswith('CAPVT: stage_attentions[1] must be one of') and 'bogus' in line, line


def test_registry_key_error_without_the_advice():
    err = KeyError('Bogus is not in the mmdet::model registry. Please check whether ...')
    assert error_line(err) == 'Bogus is not in the mmdet::model registry'


def test_main_guard_prints_one_line_and_exits_1(capsys, monkeypatch):
    monkeypatch.delenv('MMCIRC_DEBUG', raising=False)

    @main_guard
    def tool():
        raise ValueError('num_cores must be an int in [1, 64], got 100')

    with pytest.raises(SystemExit) as exc:
        tool()
    assert exc.value.code == 1
    assert capsys.readouterr().err == 'error: num_cores must be an int in [1, 64], got 100\n'


def test_debug_environment_variable_keeps_the_traceback(monkeypatch):
    monkeypatch.setenv('MMCIRC_DEBUG', '1')

    @main_guard
    def tool():
        raise ValueError('bad value')

    with pytest.raises(ValueError, match='bad value'):
        tool()


def test_train_tool_bad_stage_attentions_is_one_error_line(tmp_path):
    proc = run_tool(
        ['tools/train.py', RETINANET, '--work-dir', str(tmp_path), '--cfg-options', BAD_ATTENTIONS],
        cwd=REPO,
        check=False,
        env=dict(MMCIRC_DEBUG='0'),
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert 'Traceback' not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith('error: CAPVT: stage_attentions') and 'bogus' in lines[-1]


def test_test_tool_bad_num_cores_is_one_error_line(tmp_path):
    ckpt = tmp_path / 'none.pth'
    ckpt.write_bytes(b'')
    proc = run_tool(
        [
            'tools/test.py',
            'configs/core_pvt_t_fpn_80k_ade20k.py',
            str(ckpt),
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            'model.backbone.num_cores=100',
        ],
        cwd=REPO,
        check=False,
        env=dict(MMCIRC_DEBUG='0'),
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-2000:]
    last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith('error: ') and 'num_cores' in last and '100' in last, last


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    monkeypatch.delenv('MMCIRC_DEBUG', raising=False)

    @main_guard
    def tool():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exc:
        tool()
    assert exc.value.code == 130
    assert capsys.readouterr().err == 'error: interrupted\n'


def test_a_refused_system_call_is_one_line_in_words(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv('MMCIRC_DEBUG', raising=False)

    @main_guard
    def tool():
        open(tmp_path, 'w')  # a folder

    with pytest.raises(SystemExit) as exc:
        tool()
    assert exc.value.code == 1
    assert capsys.readouterr().err == f'error: {tmp_path}: Is a directory\n'
