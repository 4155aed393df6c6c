"""Every config in configs/ loads and builds its model (pretrained init switched off)."""
import glob
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

import mmcirc  # noqa: F401
from helpers import REPO
from mmcirc.registry import model_registries

CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True))
CONFIGS = [c for c in CONFIGS if '_base_' not in c]
DATA_ROOTS = {'mmdet': 'data/coco/', 'mmseg': 'data/ade/ADEChallengeData2016',
              'mmpretrain': 'data/imagenet'}


def _name(path):
    return osp.relpath(path, osp.join(REPO, 'configs'))


def test_configs_exist():
    names = {_name(c) for c in CONFIGS}
    assert 'ca_pvt_s_retinanet_coco.py' in names and len(names) >= 40


@pytest.mark.parametrize('path', CONFIGS, ids=_name)
def test_config_builds_model(path):
    cfg = Config.fromfile(path)
    scope = cfg.default_scope
    assert cfg.custom_imports['imports'] == ['mmcirc']
    init_default_scope(scope)
    backbone = cfg.model.backbone
    assert backbone.type in ('CAPVT', 'CorePVT', 'CASwin', 'CoreSwin', 'CADeiT', 'VECAViT')
    if 'toy' not in path:
        # real recipes read the standard dataset folders
        assert cfg.train_dataloader.dataset.get('data_root', '').rstrip('/') == \
            DATA_ROOTS[scope].rstrip('/') or 'imagenet' in str(cfg.train_dataloader.dataset)
        if backbone.get('init_cfg'):
            assert backbone.init_cfg.type == 'Pretrained'
    backbone.init_cfg = None
    registry = dict(zip(('mmdet', 'mmseg', 'mmpretrain'), model_registries()))[scope]
    model = registry.build(cfg.model)
    assert sum(p.numel() for p in model.backbone.parameters()) > 0
