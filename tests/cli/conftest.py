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


def _visualizer_classes():
    from mmengine.visualization import Visualizer

    todo, found = [Visualizer], []
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


@pytest.fixture(autouse=True)
def _visualizers_per_test():
    """mmengine's visualizers are named instances of the process, and configs name theirs
    'visualizer': a command run in one test would leave its library's visualizer to the
    next test's run of another library. Drops the instances made during the test."""
    try:
        before = {cls: set(cls._instance_dict) for cls in _visualizer_classes()}
    except ImportError:  # a torch-only machine
        yield
        return
    yield
    for cls in _visualizer_classes():
        for name in [n for n in cls._instance_dict if n not in before.get(cls, ())]:
            cls._instance_dict.pop(name, None)
