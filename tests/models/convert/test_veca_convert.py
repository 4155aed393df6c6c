"""VECA checkpoints (mmcirc.models.convert.veca) on the official-code fixture
(tests/fixtures/official, see make_official_fixtures.py): what is loaded, new and unused
is compared with the official state dict's own keys."""

import os.path as osp

import pytest
import torch

from helpers import REPO
from mmcirc.models.convert.veca import (
    convert_veca_official,
    settings_differ,
    veca_settings_of,
)
from mmcirc.models.convert import CheckpointKindError, ConversionError

FIXTURES = osp.join(REPO, 'tests', 'fixtures', 'official')


def _fix(name):
    return torch.load(osp.join(FIXTURES, name), weights_only=True)


def test_veca_everything_loaded():
    fix = _fix('veca_official.pth')
    src = fix['checkpoint']['student']
    result, model = convert_veca_official(fix['checkpoint'], arch=fix['arch'])
    assert result.new == [] and result.unused == []
    names = {k[len('module.') :]: v for k, v in src.items()}
    chunks = sorted(k for k in names if k.startswith('query_token_chunks.'))
    coords = sorted(k for k in names if k.startswith('qcoord_chunks.'))
    assert len(chunks) == 3
    torch.testing.assert_close(
        result.state_dict['backbone.cores'],
        torch.cat([names[k][0] for k in chunks]),
        rtol=0,
        atol=0,
    )
    torch.testing.assert_close(
        result.state_dict['backbone.core_coords'],
        torch.cat([names[k][0] for k in coords]),
        rtol=0,
        atol=0,
    )
    assert result.sources['backbone.cores'] == chunks
    for key, value in names.items():
        if 'chunks' not in key:
            assert torch.equal(result.state_dict['backbone.' + key], value), key
    assert (
        result.meta['backbone']['patch_size'] == 8 and result.meta['backbone']['out_channels'] == 40
    )


def test_veca_arch_from_config():
    fix = _fix('veca_official.pth')
    family, kwargs = veca_settings_of(fix['checkpoint']['config'])
    assert family == 'small' and kwargs['core_chunk'] == 8 and kwargs['rope_p_zero_freqs'] == 0.125
    # without the override the config's family (small: 384 wide) does not fit the 48-wide tensors
    with pytest.raises(ConversionError, match="model_family 'small'"):
        convert_veca_official(fix['checkpoint'])


def test_veca_student_prefix():
    fix = _fix('veca_official.pth')
    ckpt = fix['checkpoint']
    ckpt['student'] = {
        'module.student.' + k[len('module.') :]: v for k, v in ckpt['student'].items()
    }
    result, _ = convert_veca_official(ckpt, arch=fix['arch'])
    assert result.new == [] and result.unused == []


def test_veca_converter_refuses_cadeit():
    with pytest.raises(
        CheckpointKindError, match='this is a CA-DeiT checkpoint .*, not VECA'
    ) as err:
        convert_veca_official(_fix('ca_deit_official.pth')['checkpoint'])
    assert err.value.found == 'cadeit' and isinstance(err.value, ConversionError)


def test_veca_incomplete_bank():
    fix = _fix('veca_official.pth')
    del fix['checkpoint']['student']['module.qcoord_chunks.1']
    with pytest.raises(ConversionError, match='core bank chunks'):
        convert_veca_official(fix['checkpoint'], arch=fix['arch'])


def test_veca_unknown_family():
    fix = _fix('veca_official.pth')
    fix['checkpoint']['config']['model_family'] = 'giant'
    with pytest.raises(ConversionError, match="model_family must be one of .* got 'giant'"):
        convert_veca_official(fix['checkpoint'])


def test_veca_output_loads_through_init_cfg(tmp_path):
    """What the dense configs do: init_cfg=Pretrained(prefix='backbone.') on the
    converter's output file reproduces the official outputs."""
    from mmcirc.models.backbones import VECAViT
    from mmcirc.models.convert import save_checkpoint

    fix = _fix('veca_official.pth')
    result, _ = convert_veca_official(fix['checkpoint'], arch=fix['arch'])
    path = save_checkpoint(result, str(tmp_path / 'veca.pth'))
    model = VECAViT(
        arch=fix['arch'],
        patch_size=8,
        out_channels=40,
        num_cores=16,
        out_type='global_token',
        init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'),
    )
    model.init_weights()
    model.eval()
    with torch.no_grad():
        token = model(fix['input'])[0]
    torch.testing.assert_close(
        token, fix['global_16'], rtol=1e-5, atol=1e-5 * float(fix['global_16'].abs().max())
    )


def test_settings_differ_names_the_function_changing_arguments_only():
    """The defaults where absent; input channels and dropout change no trained function."""
    assert settings_differ({}, {'patch_size': 16, 'in_channels': 1, 'dropout': 0.5}) == {}
    _, trained = veca_settings_of({'patch_size': 14, 'distill_output_dim': 40})
    assert settings_differ(trained, {'patch_size': 14}) == {'out_channels': 40}
