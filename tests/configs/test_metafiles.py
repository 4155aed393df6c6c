"""``model-index.yml`` and the metafiles it imports (OpenMMLab's format, what ``mim
search`` reads) load, name every config and only configs that exist, claim no result and
no weights, carry the counts of the zoo's results file, and every config they name builds
with the parameter count its metafile states (on the meta device: no weights allocated)."""

import glob
import json
import os.path as osp

import pytest
import torch
import yaml
from mmengine.registry import init_default_scope

import mmcirc  # noqa: F401
from helpers import REPO
from mmcirc.registry import model_registries
from test_configs import load

INDEX = osp.join(REPO, 'model-index.yml')
ZOO = osp.join(REPO, 'docs', 'results', 'model_zoo.json')


def _yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


def _metafiles():
    return _yaml(INDEX)['Import']


def _models():
    """[(metafile, model entry)] over every metafile the index imports."""
    return [(m, model) for m in _metafiles() for model in _yaml(osp.join(REPO, m))['Models']]


def test_the_index_imports_every_metafile_under_configs():
    found = {
        osp.relpath(p, REPO) for p in glob.glob(osp.join(REPO, 'configs', '*', 'metafile.yml'))
    }
    assert found and set(_metafiles()) == found


def test_every_model_is_in_a_collection_of_its_metafile():
    for metafile, model in _models():
        names = {c['Name'] for c in _yaml(osp.join(REPO, metafile))['Collections']}
        assert model['In Collection'] in names, (metafile, model['Name'])


def test_the_metafiles_name_every_config_once():
    named = [model['Config'] for _, model in _models()]
    configs = {osp.relpath(p, REPO) for p in glob.glob(osp.join(REPO, 'configs', '*.py'))}
    assert sorted(named) == sorted(configs)


def test_no_model_claims_a_result_or_weights():
    for _, model in _models():
        assert model['Results'] == [] and 'Weights' not in model, model['Name']


def test_the_metadata_is_the_zoo_results_file():
    with open(ZOO) as f:
        counted = json.load(f)['configs']
    for _, model in _models():
        c = counted[osp.basename(model['Config'])]
        assert model['Metadata']['Parameters'] == c['params'], model['Name']
        assert model['Metadata']['FLOPs'] == c['flops'], model['Name']


def _build_on_meta(cfg):
    init_default_scope(cfg.default_scope)
    registry = dict(zip(('mmdet', 'mmseg', 'mmpretrain'), model_registries()))[cfg.default_scope]
    with torch.device('meta'):
        return registry.build(cfg.model)


@pytest.mark.parametrize('metafile, model', _models(), ids=[m['Name'] for _, m in _models()])
def test_every_named_config_builds_with_its_stated_parameters(metafile, model):
    built = _build_on_meta(load(osp.join(REPO, model['Config'])))
    assert sum(p.numel() for p in built.parameters()) == model['Metadata']['Parameters']
