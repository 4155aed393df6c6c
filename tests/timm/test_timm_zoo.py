"""Registration with timm: the names, their local-file pretrained configs, and what
``import mmcirc`` / ``import mmcirc.timm`` import."""

import os
import os.path as osp
import subprocess
import sys

import pytest
import timm
import torch

import mmcirc.timm
from helpers import REPO, run_torch_only, torch_only_origin

EXPECTED = (
    ['ca_deit_tiny', 'ca_deit_small', 'ca_deit_base', 'veca_small', 'veca_base']
    + [f'ca_pvt_{a}' for a in ('tiny', 'small', 'medium', 'large')]
    + [f'ca_swin_{a}' for a in ('tiny', 'small', 'base')]
    + ['core_pvt_tiny', 'core_pvt_small', 'core_swin_tiny', 'core_swin_small']
)


def test_the_issue_models_are_registered_in_one_module():
    assert sorted(timm.list_models(module='zoo')) == sorted(EXPECTED)
    assert sorted(mmcirc.timm.MODEL_NAMES) == sorted(EXPECTED)


def test_each_model_has_its_own_written_entry_point():
    """timm's form: ``@register_model def <name>(pretrained=False, **kwargs)`` with a
    one-line docstring, written out in zoo.py (nothing generated into its globals)."""
    import ast

    tree = ast.parse(open(osp.join(REPO, 'mmcirc', 'timm', 'zoo.py')).read())
    defs = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and [ast.unparse(d) for d in node.decorator_list] == ['register_model']
    }
    assert sorted(defs) == sorted(EXPECTED)
    for name, node in defs.items():
        assert [a.arg for a in node.args.args] == ['pretrained'] and node.args.kwarg.arg == 'kwargs'
        doc = ast.get_docstring(node)
        assert doc and '\n' not in doc, name
        assert timm.models.model_entrypoint(name).__doc__ == doc
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == 'globals']


@pytest.mark.parametrize('name', EXPECTED)
def test_pretrained_cfg_is_the_configs_evaluation_and_names_no_download(name):
    cfg = timm.models.get_pretrained_cfg(name).to_dict()
    assert cfg['input_size'] == (3, 224, 224) and cfg['crop_pct'] == 0.875
    assert cfg['interpolation'] == 'bicubic' and cfg['mean'] == (0.485, 0.456, 0.406)
    assert cfg['classifier'] == 'head' and cfg['custom_load'] is True
    assert cfg['num_classes'] == (0 if name.startswith('veca') else 1000)
    assert not any(cfg.get(k) for k in ('url', 'hf_hub_id', 'file'))


@pytest.mark.parametrize('name', ['ca_deit_tiny', 'veca_small', 'ca_pvt_tiny', 'ca_swin_tiny'])
def test_first_conv_and_classifier_name_the_model_layers(small, name):
    model = small(name, num_classes=3)
    cfg = model.pretrained_cfg
    layers = dict(model.named_modules())
    assert isinstance(layers[cfg['first_conv']], torch.nn.Conv2d)
    assert layers[cfg['classifier']] is model.get_classifier()
    assert model.default_cfg is model.pretrained_cfg


def test_pretrained_without_a_file_refuses_and_downloads_nothing(small):
    with pytest.raises(RuntimeError, match='No pretrained weights'):
        small('ca_deit_tiny', pretrained=True)


def test_out_indices_without_features_only_is_refused():
    with pytest.raises(ValueError, match='features_only'):
        timm.create_model('ca_deit_tiny', out_indices=(0, 1))


def test_import_mmcirc_does_not_import_timm():
    code = 'import sys, mmcirc; print(sorted(m for m in sys.modules if m.split(".")[0] == "timm"))'
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == '[]'


TORCH_ONLY = r"""
import os.path as osp, tempfile
import timm, torch
import mmcirc.timm
fix = torch.load(osp.join(REPO, 'tests/fixtures/official/ca_deit_official.pth'), weights_only=True)
path = osp.join(tempfile.mkdtemp(), 'ca_deit.pth')
torch.save(fix['checkpoint'], path)
m = timm.create_model('ca_deit_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=path),
                      arch=fix['arch'], patch_size=fix['patch_size'], num_classes=10).eval()
with torch.no_grad():
    err = float((m(fix['input']) - fix['logits']).norm() / fix['logits'].norm())
v = timm.create_model('veca_small', arch=dict(embed_dims=16, num_layers=2, num_heads=2,
                      mlp_ratio=2.0, num_cores=8), patch_size=8)
print(err < 1e-5, tuple(v.forward_features(torch.randn(1, 3, 24, 40)).shape))
try:
    timm.create_model('ca_pvt_tiny')
except ModuleNotFoundError as e:
    print('pyramid:', e.name)
"""


def test_mmcirc_timm_needs_neither_mmdet_nor_mmseg_nor_mmpretrain():
    """In a process where the OpenMMLab packages cannot be imported (the torch-only
    machine), the isotropic models register, load a released file and run; a pyramid
    says which package it needs."""
    proc = run_torch_only(code=TORCH_ONLY, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == 'True (1, 23, 16)'
    assert lines[1] == 'pyramid: mmdet'
    assert torch_only_origin(proc) == dict(mmcirc=osp.join(REPO, 'mmcirc', '__init__.py'), mm=[])


def test_the_timm_modules_import_one_way():
    """model -> weights only (the weights never import the models, not even inside a
    function): no import cycle in mmcirc.timm."""
    import ast

    edges = set()
    for name in ('model', 'isotropic', 'pyramid', 'weights', 'zoo'):
        tree = ast.parse(open(osp.join(REPO, 'mmcirc', 'timm', f'{name}.py')).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                edges.add((name, node.module))
    assert ('model', 'weights') in edges
    assert not {(a, b) for a, b in edges if (b, a) in edges}
