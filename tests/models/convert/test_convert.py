"""The converters' shared core (mmcirc.models.convert): unwrapping, provenance, the one
result builder and report, the released-kind check and the file-to-file entry point.
Expectations are written from the inputs (hand-made modules and converters, the fakes of
tests/checkpoint_fakes.py, the official-code fixtures), not from the code under test."""

import os
import os.path as osp
import re
from collections import OrderedDict

import pytest
import torch
from torch import nn

from checkpoint_fakes import PVT_ARCH, PVT_IMG, capvt, official_pvt
from helpers import REPO, run_torch_only
from mmcirc.engine import load_from_local
from mmcirc.models.convert.deit import convert_cadeit_official
from mmcirc.models.convert.pyramid import convert_pyramid
from mmcirc.models.convert.veca import convert_veca_official
from mmcirc.models.convert import (
    CheckpointKindError,
    ConversionError,
    build_result,
    convert_file,
    expect_released,
    format_summary,
    shape_mismatches,
    trace_provenance,
    unwrap_state_dict,
)
from mmcirc.models.families import converters

FIXTURES = osp.join(REPO, 'tests', 'fixtures', 'official')


def _fix(name):
    return torch.load(osp.join(FIXTURES, name), weights_only=True)


# ----------------------------------------------------------------------------- source
def test_unwrap_state_dict_wrappers_and_prefixes():
    w, b = torch.zeros(2), torch.ones(2)
    sd, outside = unwrap_state_dict({'state_dict': {'module.a': w, 'module.b': b}, 'meta': {}})
    assert list(sd) == ['a', 'b'] and sd['a'] is w and outside == []
    detector = {
        'model': {'backbone.x': w, 'neck.y': b, 'head.z': b, 'step': 3},
    }
    sd, outside = unwrap_state_dict(detector)
    assert list(sd) == ['x'] and outside == ['step', 'neck.y', 'head.z']
    with pytest.raises(ConversionError, match='expected a checkpoint dict, got list'):
        unwrap_state_dict([w])
    with pytest.raises(ConversionError, match='no tensors found'):
        unwrap_state_dict({'model': {'epoch': 1}})


def test_trace_provenance_reads_what_each_output_came_from():
    """A converter that concatenates, slices, transposes, reshapes and renames: each
    output's sources are what the converter was written to use."""
    sd = OrderedDict(
        q=torch.randn(4, 3), kv=torch.randn(8, 3), w=torch.randn(2, 6), e=torch.empty(0)
    )

    def convert(s):
        return OrderedDict(
            in_proj=torch.cat([s['q'], s['kv']]),
            k_only=s['kv'][:4],
            w_t=s['w'].t(),
            w_conv=s['w'].reshape(2, 6, 1, 1),
            empty=s['e'],
        )

    assert trace_provenance(convert, sd) == {
        'in_proj': ['q', 'kv'],
        'k_only': ['kv'],
        'w_t': ['w'],
        'w_conv': ['w'],
        'empty': [],
    }


def test_expect_released_names_the_kind_found():
    ca, veca = _fix('ca_deit_official.pth')['checkpoint'], _fix('veca_official.pth')['checkpoint']
    expect_released(ca, 'deit')
    expect_released(veca, 'veca')
    with pytest.raises(
        CheckpointKindError, match=r'this is a VECA checkpoint \(\{"student"'
    ) as err:
        expect_released(veca, 'deit')
    assert err.value.found == 'veca'
    with pytest.raises(CheckpointKindError, match='this is a CA-DeiT checkpoint') as err:
        expect_released(ca, 'veca')
    assert err.value.found == 'cadeit'
    with pytest.raises(ConversionError, match="family must be one of .*got 'vit'"):
        expect_released(ca, 'vit')


def test_foreign_checkpoint_says_what_was_expected():
    with pytest.raises(
        ConversionError, match=r'not a VECA checkpoint: expected \{"student"'
    ) as err:
        convert_veca_official({'model': {'w': torch.zeros(1)}})
    assert not isinstance(err.value, CheckpointKindError)


def test_foreign_checkpoints_refused():
    """A plain DeiT (no gate, no CPE) and an arbitrary dict are neither CA-DeiT nor VECA."""
    deit = {
        'model': {
            'cls_token': torch.zeros(1, 1, 8),
            'pos_embed': torch.zeros(1, 5, 8),
            'blocks.0.attn.qkv.weight': torch.zeros(24, 8),
            'blocks.0.attn.qkv.bias': torch.zeros(24),
        }
    }
    with pytest.raises(ConversionError, match='not a CA-DeiT checkpoint.*circulant attention'):
        convert_cadeit_official(deit)
    with pytest.raises(ConversionError, match=r'not a VECA checkpoint: expected \{"student"'):
        convert_veca_official(deit)
    with pytest.raises(ConversionError, match='not a VECA checkpoint'):
        convert_veca_official([1, 2])


# ----------------------------------------------------------------------------- result
class _Toy(nn.Module):
    """Two parameters, one treated as replaced attention, and a buffer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.gate = nn.Parameter(torch.zeros(2))
        self.register_buffer('index', torch.arange(4))


def test_build_result_classifies_every_tensor():
    model = _Toy()
    src = {'w_src': torch.randn(2, 3), 'extra_src': torch.randn(5), 'stray': torch.randn(1)}
    result = build_result(
        model,
        {'fc.weight': src['w_src'], 'foreign': torch.zeros(1)},
        {'fc.weight': ['w_src'], 'foreign': ['stray']},
        list(src),
        'official',
        converter='test',
        prefix='backbone.',
        extra={'head.fc.bias': (src['extra_src'], ['extra_src'])},
        attention_keys=['gate'],
        info={'source_layout': 'official'},
        meta={'source': 'x.pth'},
    )
    # model order (own parameters and buffers before the submodules'), then the extra
    assert list(result.state_dict) == ['backbone.index', 'backbone.fc.weight', 'head.fc.bias']
    assert result.loaded == ['backbone.fc.weight', 'head.fc.bias']
    assert result.sources == {'backbone.fc.weight': ['w_src'], 'head.fc.bias': ['extra_src']}
    assert result.from_model == ['backbone.index']
    assert torch.equal(result.state_dict['backbone.index'], model.index)
    assert result.new_attention == ['backbone.gate'] and result.new_other == ['backbone.fc.bias']
    assert result.unused == ['stray', 'foreign']  # a source nobody used, a tensor with no place
    # copies, not views of the source
    assert torch.equal(result.state_dict['backbone.fc.weight'], src['w_src'])
    assert result.state_dict['backbone.fc.weight'].data_ptr() != src['w_src'].data_ptr()
    assert result.meta == dict(
        converter='test',
        source_layout='official',
        loaded=2,
        new=['backbone.gate', 'backbone.fc.bias'],
        unused=['stray', 'foreign'],
        source='x.pth',
    )
    assert result.sizes['backbone.fc.weight'] == 6 and result.sizes['head.fc.bias'] == 5


def test_shape_mismatches_lists_only_model_keys_of_another_shape():
    target = {'a': torch.zeros(2, 3), 'b': torch.zeros(4), 'c': torch.zeros(1)}
    given = {'b': torch.zeros(5), 'x': torch.zeros(7), 'a': torch.zeros(3, 2), 'c': torch.zeros(1)}
    assert shape_mismatches(given, target, 'base') == [
        'b: base (5,) vs model (4,)',
        'a: base (3, 2) vs model (2, 3)',
    ]
    assert shape_mismatches({'c': torch.ones(1)}, target) == []


def test_build_result_refuses_a_tensor_of_another_shape():
    with pytest.raises(
        ConversionError,
        match=r'1 tensor\(s\) do not fit _Toy:\n  fc.weight: checkpoint \(3, 2\) vs model \(2, 3\)',
    ):
        build_result(
            _Toy(),
            {'fc.weight': torch.zeros(3, 2)},
            {'fc.weight': ['w']},
            ['w'],
            'x',
            converter='t',
        )


def test_whole_model_summary_lists_new_and_unused_keys():
    model = _Toy()
    result = build_result(
        model,
        {'fc.weight': torch.zeros(2, 3), 'index': model.index},
        {'fc.weight': ['a'], 'index': ['i']},
        ['a', 'i', 'b.0.x', 'b.1.x'],
        'official',
        converter='t',
        whole_model=True,
    )
    assert format_summary(result, 'T').splitlines() == [
        'T',
        'loaded: 2 tensors (10 values)',
        'new (not in the checkpoint): 2 tensors',
        '    gate',
        '    fc.bias',
        'unused (in the checkpoint, not loaded): 2 tensors',
        '    b.0.x',
        '    b.1.x',
    ]


def test_summary_cut_says_how_to_see_all():
    res = convert_pyramid(official_pvt(), capvt())
    res.unused = [f'extra{i}.weight' for i in range(20)]  # 20 groups: 16 shown
    assert '    ... 4 more (verbose=True lists all)' in format_summary(res, 'test').splitlines()
    assert (
        '    ... 4 more (--verbose lists all)'
        in format_summary(res, 'test', more_hint='--verbose lists all').splitlines()
    )
    assert 'extra19.weight' in format_summary(res, 'test', verbose=True)


# ----------------------------------------------------------------------------- file to file
def test_convert_file_writes_what_convert_pyramid_gives(tmp_path):
    torch.save(official_pvt(), tmp_path / 'src.pth')
    result, out, title = convert_file(
        'pvt',
        str(tmp_path / 'src.pth'),
        str(tmp_path / 'out.pth'),
        arch=PVT_ARCH,
        pos_embed_size=PVT_IMG,
    )
    ref = convert_pyramid(official_pvt(), capvt())
    ckpt = load_from_local(out, map_location=None)
    assert set(ckpt['state_dict']) == set(ref.state_dict) and result.unused == ref.unused
    for k, v in ref.state_dict.items():
        assert torch.equal(ckpt['state_dict'][k], v), k
    assert title.startswith('PVT (official layout) -> CAPVT(')


@pytest.mark.parametrize(
    'kwargs,name',
    [
        (dict(pos_embed_size=0), 'pos_embed_size'),
        (dict(backbone_options=['num_cores_max=8']), 'backbone_options'),
        (dict(src_layout='timm'), 'src_layout'),
    ],
)
def test_convert_file_names_the_bad_parameter_and_writes_nothing(tmp_path, kwargs, name):
    torch.save(official_pvt(), tmp_path / 'src.pth')
    with pytest.raises(ConversionError, match=name):
        convert_file(
            'pvt', str(tmp_path / 'src.pth'), str(tmp_path / 'out.pth'), arch=PVT_ARCH, **kwargs
        )
    assert [p.name for p in tmp_path.iterdir()] == ['src.pth']


@pytest.mark.parametrize('family', ['deit', 'veca'])
def test_convert_file_released_kinds(tmp_path, monkeypatch, family):
    """The released files go through the same entry point: the default output name,
    the same tensors as the in-memory converter, the source's name in meta."""
    fix = _fix('ca_deit_official.pth' if family == 'deit' else 'veca_official.pth')
    torch.save(fix['checkpoint'], tmp_path / 'src.pth')
    monkeypatch.chdir(tmp_path)
    arch = fix['arch'] if family == 'veca' else None
    result, out, title = convert_file(family, 'src.pth', arch=arch)
    convert = convert_cadeit_official if family == 'deit' else convert_veca_official
    ref, _ = convert(fix['checkpoint'], arch=arch)
    name = 'ca_deit_custom' if family == 'deit' else 'veca_custom'
    assert out == f'work_dirs/pretrained/{name}_official.pth'
    saved = load_from_local(str(tmp_path / out), map_location=None)
    assert list(saved['state_dict']) == list(ref.state_dict)
    for k, v in ref.state_dict.items():
        assert torch.equal(saved['state_dict'][k], v), k
    assert saved['meta']['source'] == 'src.pth' and result.whole_model
    assert title.startswith('CA-DeiT (' if family == 'deit' else 'VECA (custom, ')


def test_convert_file_unknown_family(tmp_path):
    torch.save(official_pvt(), tmp_path / 'src.pth')
    with pytest.raises(
        ConversionError, match=re.escape(f"family must be one of {tuple(converters())}, got 'vit'")
    ):
        convert_file('vit', str(tmp_path / 'src.pth'))
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        convert_file('deit', str(tmp_path / 'missing.pth'))


TORCH_ONLY = r"""
import torch
from mmcirc.models.convert import format_summary
from mmcirc.models.convert.deit import convert_cadeit_official
from mmcirc.models.convert.veca import convert_veca_official
fix = torch.load(REPO + '/tests/fixtures/official/ca_deit_official.pth', weights_only=True)
result, _ = convert_cadeit_official(fix['checkpoint'])
print(format_summary(result, 'ca').splitlines()[2])
fix = torch.load(REPO + '/tests/fixtures/official/veca_official.pth', weights_only=True)
result, _ = convert_veca_official(fix['checkpoint'], arch=fix['arch'])
print(format_summary(result, 'veca').splitlines()[3])
"""


def test_isotropic_converters_need_torch_only():
    """The core and the CA-DeiT / VECA converters import and convert with torch alone."""
    proc = run_torch_only(code=TORCH_ONLY, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[:2] == [
        'new (not in the checkpoint): 0 tensors',
        'unused (in the checkpoint, not loaded): 0 tensors',
    ]


def test_converters_import_the_models_never_the_reverse():
    """Read from the source: no module of mmcirc/models outside mmcirc/models/convert
    imports the converters (at module level or in a function), and none calls
    ``locals()``; the family table holds every converter."""
    import ast

    models = osp.join(REPO, 'mmcirc', 'models')
    for root, _, files in os.walk(models):
        for name in files:
            path = osp.join(root, name)
            if not name.endswith('.py') or osp.join(models, 'convert') in path:
                continue
            tree = ast.parse(open(path).read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    module = '.' * node.level + (node.module or '')
                    names = [module] + [f'{module}.{a.name}' for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    names = []
                assert not any(re.search(r'(^|\.)convert(\.|$)', n) for n in names), path
                if isinstance(node, ast.Call):
                    assert getattr(node.func, 'id', None) != 'locals', path
    assert tuple(converters()) == ('pvt', 'swin', 'deit', 'veca')
