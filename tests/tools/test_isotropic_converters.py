"""cadeit_to_mmcirc.py --family deit and veca_to_mmcirc.py from the command line, on the
official-code fixtures (tests/fixtures/official): report, output, one-line errors and
no output file on bad input. One run per tool goes through a fresh process; the error
cases call in this process the package's ``main`` the scripts are entry points of (same
code, no second start-up)."""

import os.path as osp

import pytest
import torch

from helpers import REPO, run_tool

FIXTURES = osp.join(REPO, 'tests', 'fixtures', 'official')
CADEIT = 'tools/model_converters/cadeit_to_mmcirc.py'
VECA = 'tools/model_converters/veca_to_mmcirc.py'


def _fix(name):
    return torch.load(osp.join(FIXTURES, name), weights_only=True)


def _load(path):
    from mmcirc.engine import load_from_local

    return load_from_local(str(path), map_location=None)


@pytest.fixture
def run_tool_main(run_main):
    """run_tool_main(tool, args, cwd): the package's ``main`` of ``tool`` (conftest.run_main)."""
    from mmcirc.cli import convert as cli

    mains = {CADEIT: cli.cadeit_main, VECA: cli.veca_main}
    return lambda tool, args, cwd: run_main(mains[tool], args, cwd)


def _one_line_error(proc, *parts):
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def test_cadeit_cli_report_and_output(tmp_path):
    fix = _fix('ca_deit_official.pth')
    torch.save(fix['checkpoint'], tmp_path / 'ca_deit_small.pth')
    proc = run_tool([CADEIT, 'ca_deit_small.pth', 'out.pth', '--family', 'deit'], cwd=tmp_path)
    n = len(fix['checkpoint']['model'])
    assert f'loaded: {n} tensors' in proc.stdout
    assert 'new (not in the checkpoint): 0 tensors' in proc.stdout
    assert 'unused (in the checkpoint, not loaded): 0 tensors' in proc.stdout
    out = _load(tmp_path / 'out.pth')
    assert torch.equal(
        out['state_dict']['head.fc.weight'], fix['checkpoint']['model']['head.weight']
    )
    assert out['meta']['source'] == 'ca_deit_small.pth'


def test_veca_cli_report_and_default_output(tmp_path, run_tool_main):
    fix = _fix('veca_official.pth')
    torch.save(fix['checkpoint'], tmp_path / 'veca.pt')
    proc = run_tool_main(VECA, ['veca.pt', '--arch', repr(fix['arch'])], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert 'new (not in the checkpoint): 0 tensors' in proc.stdout
    assert 'unused (in the checkpoint, not loaded): 0 tensors' in proc.stdout
    out = _load(tmp_path / 'work_dirs' / 'pretrained' / 'veca_custom_official.pth')
    assert out['state_dict']['backbone.cores'].shape == (24, 48)


def test_veca_checkpoint_to_cadeit_converter(tmp_path, run_tool_main):
    torch.save(_fix('veca_official.pth')['checkpoint'], tmp_path / 'veca.pt')
    proc = run_tool_main(CADEIT, ['veca.pt', 'out.pth', '--family', 'deit'], tmp_path)
    _one_line_error(proc, 'VECA checkpoint', 'veca_to_mmcirc.py')
    assert not (tmp_path / 'out.pth').exists()


def test_cadeit_checkpoint_to_veca_converter(tmp_path, run_tool_main):
    torch.save(_fix('ca_deit_official.pth')['checkpoint'], tmp_path / 'ca.pth')
    proc = run_tool_main(VECA, ['ca.pth', 'out.pth'], tmp_path)
    _one_line_error(proc, 'CA-DeiT checkpoint', '--family deit')
    assert not (tmp_path / 'out.pth').exists()


def test_truncated_checkpoint(tmp_path, run_tool_main):
    torch.save(_fix('veca_official.pth')['checkpoint'], tmp_path / 'full.pt')
    data = (tmp_path / 'full.pt').read_bytes()
    (tmp_path / 'cut.pt').write_bytes(data[: len(data) // 2])
    for tool in (VECA, CADEIT):
        proc = run_tool_main(
            tool, ['cut.pt', 'out.pth'] + (['--family', 'deit'] if tool == CADEIT else []), tmp_path
        )
        _one_line_error(proc, 'cannot read cut.pt')
        assert not (tmp_path / 'out.pth').exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['cut.pt', 'full.pt']


def test_wrong_arch(tmp_path, run_tool_main):
    torch.save(_fix('ca_deit_official.pth')['checkpoint'], tmp_path / 'ca.pth')
    proc = run_tool_main(
        CADEIT, ['ca.pth', 'out.pth', '--family', 'deit', '--arch', 'huge'], tmp_path
    )
    _one_line_error(proc, "arch must be one of ('tiny', 'small', 'base')")
    proc = run_tool_main(
        CADEIT, ['ca.pth', 'out.pth', '--family', 'deit', '--arch', 'small'], tmp_path
    )
    _one_line_error(proc, "arch 'small'", "'embed_dims': 48")
    assert not (tmp_path / 'out.pth').exists()


def test_unsafe_pickle_refused(tmp_path, run_tool_main):
    """The official VECA loader unpickles everything; ours refuses foreign objects."""
    import argparse

    fix = _fix('veca_official.pth')
    ckpt = dict(fix['checkpoint'], extra=argparse.Namespace(a=1))
    torch.save(ckpt, tmp_path / 'veca.pt')
    proc = run_tool_main(VECA, ['veca.pt', 'out.pth', '--arch', repr(fix['arch'])], tmp_path)
    _one_line_error(proc, 'refused: it would run code', 'argparse.Namespace')
    assert not (tmp_path / 'out.pth').exists()
