"""mmcirc.cli.runner.load_config: the run's config of tools/train.py and tools/test.py
(the one config loader, plus the launcher and the work_dir settled)."""

import os.path as osp
import re

import pytest

from mmcirc.cli.runner import load_config

CONFIG = "default_scope = 'mmdet'\nmodel = dict(type='RetinaNet')\n"


def test_work_dir_given_else_the_configs_else_from_the_file_name(tmp_path):
    path = tmp_path / 'my_run.py'
    path.write_text(CONFIG)
    cfg = load_config(str(path))
    assert (cfg.work_dir, cfg.launcher) == (osp.join('./work_dirs', 'my_run'), 'none')
    assert load_config(str(path), work_dir='/out', launcher='pytorch').work_dir == '/out'
    path.write_text(CONFIG + "work_dir = '/from/config'\n")
    assert load_config(str(path)).work_dir == '/from/config'


def test_options_are_merged(tmp_path):
    path = tmp_path / 'run.py'
    path.write_text(CONFIG)
    cfg = load_config(str(path), {'model.type': 'FCOS', 'train_cfg.max_iters': 3})
    assert (cfg.model.type, cfg.train_cfg.max_iters) == ('FCOS', 3)


def test_bad_scope_and_missing_file_name_the_file(tmp_path):
    path = tmp_path / 'ocr.py'
    path.write_text("default_scope = 'mmocr'\nmodel = dict(type='X')\n")
    with pytest.raises(ValueError, match=f'^{re.escape(str(path))}: default_scope must be one of'):
        load_config(str(path))
    with pytest.raises(FileNotFoundError, match='config file not found: .*missing.py'):
        load_config(str(tmp_path / 'missing.py'))
