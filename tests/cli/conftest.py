"""Fixtures of the command tests."""

import os.path as osp

import pytest

from helpers import FIXTURE_CONFIGS


@pytest.fixture(scope='session')
def toy_checkpoints(tmp_path_factory):
    """{'det': path, 'seg': path}: seeded random weights of the tiny RetinaNet
    (``retinanet_r18_tiny_toy.py``) and UperNet (``ca_swin_upernet_tiny.py``) on the toy
    data, with their dataset_meta, as tools/train.py writes them."""
    import torch

    from mmcirc.apis import build_model

    folder, out = tmp_path_factory.mktemp('toy_checkpoints'), {}
    for name, cfg in (('det', 'retinanet_r18_tiny_toy.py'), ('seg', 'ca_swin_upernet_tiny.py')):
        model = build_model(osp.join(FIXTURE_CONFIGS, cfg), seed=0)
        out[name] = str(folder / f'{name}.pth')
        meta = dict(dataset_meta=model.dataset_meta)
        torch.save(dict(state_dict=model.state_dict(), meta=meta), out[name])
    return out
