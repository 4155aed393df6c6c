"""register_model puts one class into the MODELS registries of mmdet, mmseg, mmpretrain."""

import pytest
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmcirc.registry import model_registries, register_model


@register_model()
class RegistryProbeBackbone(nn.Module):
    """A stand-in backbone: what matters here is how it is found, not what it does."""

    def __init__(self, width=4):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 1)


BASES = {
    'mmdet': 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    'mmseg': 'mmseg::_base_/models/upernet_swin.py',
    'mmpretrain': 'mmpretrain::_base_/models/swin_transformer/tiny_224.py',
}


@pytest.fixture(params=sorted(BASES))
def inherited_config(request, tmp_path):
    """A config file that inherits a real base of the library and swaps the backbone."""
    path = tmp_path / f'{request.param}_probe.py'
    path.write_text(
        f"_base_ = '{BASES[request.param]}'\n"
        "model = dict(backbone=dict(_delete_=True, type='RegistryProbeBackbone', width=5))\n"
    )
    return request.param, Config.fromfile(str(path))


def test_builds_by_type_name_in_inherited_config(inherited_config):
    scope, cfg = inherited_config
    init_default_scope(scope)
    registry = dict(zip(('mmdet', 'mmseg', 'mmpretrain'), model_registries()))[scope]
    backbone = registry.build(cfg.model.backbone)
    assert isinstance(backbone, RegistryProbeBackbone) and backbone.conv.out_channels == 5


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_builds_with_scope_prefix_and_scope_key(scope):
    from mmdet.registry import MODELS

    by_prefix = MODELS.build(dict(type=f'{scope}.RegistryProbeBackbone'))
    by_key = MODELS.build(dict(type='RegistryProbeBackbone', _scope_=scope))
    assert isinstance(by_prefix, RegistryProbeBackbone)
    assert isinstance(by_key, RegistryProbeBackbone)


def test_registered_in_all_three_registries():
    for registry in model_registries():
        assert registry.module_dict['RegistryProbeBackbone'] is RegistryProbeBackbone


@pytest.mark.parametrize('name', ['SwinTransformer', 'PyramidVisionTransformer', 'ResNet'])
def test_name_clash_is_refused_everywhere(name):
    class Impostor(nn.Module):
        pass

    with pytest.raises(KeyError, match=f"'{name}'.*already registered"):
        register_model(Impostor, name=name)
    for registry in model_registries():
        assert registry.module_dict.get(name) is not Impostor


def test_clash_with_mmengine_root_name_is_refused():
    class Impostor(nn.Module):
        pass

    with pytest.raises(KeyError, match="'Conv2d'"):
        register_model(Impostor, name='Conv2d')


def test_reregistering_same_class_is_a_no_op():
    assert register_model(RegistryProbeBackbone) is RegistryProbeBackbone


# None in sys.modules: ``import X`` raises ModuleNotFoundError and find_spec('X') is None,
# as when X is not installed
BLOCK_IMPORTS = """
import sys
for name in sys.argv[1].split(','):
    sys.modules[name] = None
"""


def _run_without(packages, code):
    """Run ``code`` in a fresh interpreter where ``packages`` cannot be imported."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, '-c', BLOCK_IMPORTS + code, ','.join(packages)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_detection_user_needs_neither_mmseg_nor_mmpretrain():
    out = _run_without(
        ['mmseg', 'mmpretrain'],
        (
            'import mmcirc\n'
            'from mmdet.registry import MODELS\n'
            "m = MODELS.build(dict(type='CAPVT', arch='tiny'))\n"
            "print(type(m).__name__, *(sys.modules.get(n) is not None for n in ('mmseg', 'mmpretrain')))\n"
        ),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ['CAPVT', 'False', 'False']


def test_missing_mmdet_is_named_with_its_pip_spec():
    out = _run_without(
        ['mmdet'],
        (
            'import mmcirc, mmcirc.ops\n'  # the operators and the package itself still import
            'import mmcirc.models\n'
        ),
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert (
        last.startswith('ModuleNotFoundError: mmcirc needs mmdet')
        and "pip install 'mmdet==" in last
    )
