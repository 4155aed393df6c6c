"""List flags of the commands: a repeated flag of several values adds its values (the
default list replaced, not extended), a repeated flag whose values make one thing
(``--shape H W``) is a usage error; every list flag of every command is one or the
other."""

import argparse
import importlib
from pathlib import Path

import pytest

from mmcirc.cli.common import Accumulate, Once

#: every command of mmcirc/cli: module, the function that parses its argv
COMMANDS = [
    ('mmcirc.cli.bccb_score', 'parse_args'),
    ('mmcirc.cli.image_demo', 'parse_args'),
    ('mmcirc.cli.infer_highres', 'parse_args'),
    ('mmcirc.cli.pytorch2onnx', 'parse_args'),
    ('mmcirc.cli.test', 'parse_args'),
    ('mmcirc.cli.train', 'parse_args'),
    ('mmcirc.cli.vis_circulant', 'parse_args'),
    ('mmcirc.cli.vis_cores', 'parse_args'),
    ('mmcirc.cli.convert', 'pvt_main'),
    ('mmcirc.cli.convert', 'swin_main'),
    ('mmcirc.cli.convert', 'cadeit_main'),
    ('mmcirc.cli.convert', 'veca_main'),
    ('mmcirc.cli.get_flops', 'parse_args'),
    ('mmcirc.cli.plot_complexity', 'parse_args'),
    ('mmcirc.cli.main_job_seeds', 'parse_args'),
    ('mmcirc.cli.count_params', 'main'),
    ('mmcirc.cli.make_toy_data', 'parse_args'),
]


class _Parsed(BaseException):
    """Raised by the patched ``parse_args``: carries the parser, stops the command."""


def _parser(monkeypatch, module, func):
    def grab(parser, args=None, namespace=None):
        raise _Parsed(parser)

    monkeypatch.setattr(argparse.ArgumentParser, 'parse_args', grab)
    with pytest.raises(_Parsed) as caught:
        getattr(importlib.import_module(module), func)([])
    return caught.value.args[0]


def _list_flags(parser):
    return [
        a
        for a in parser._actions
        if a.option_strings
        and (a.nargs in ('+', '*') or (isinstance(a.nargs, int) and a.nargs > 1))
    ]


def test_every_command_with_a_parser_is_listed():
    cli = Path(importlib.import_module('mmcirc.cli').__file__).parent
    parsers = {
        f'mmcirc.cli.{p.stem}' for p in cli.glob('*.py') if 'ArgumentParser(' in p.read_text()
    }
    assert parsers == {module for module, _ in COMMANDS}


@pytest.mark.parametrize('module, func', COMMANDS)
def test_every_list_flag_accumulates_or_refuses_a_repeat(monkeypatch, module, func):
    from mmcirc.cli.common import _CfgOptions

    for action in _list_flags(_parser(monkeypatch, module, func)):
        assert isinstance(action, (Accumulate, Once, _CfgOptions)), (
            f'{module}.{func} {action.option_strings[0]}: a repeat keeps only the last values'
        )


def test_repeated_img_adds_every_image():
    from mmcirc.cli.infer_highres import parse_args

    args = parse_args(['c.py', '--img', 'a.png', '--img', 'b.png', 'c.png'])
    assert args.img == ['a.png', 'b.png', 'c.png']


def test_a_repeated_list_flag_replaces_the_default_once():
    from mmcirc.cli.vis_cores import parse_args

    assert parse_args(['c.py', '--demo', 'astronaut']).num_cores == ['8', '16', '64']
    args = parse_args(['c.py', '--demo', 'astronaut', '--num-cores', '4', '--num-cores', '2'])
    assert args.num_cores == ['4', '2']


def test_repeated_cfg_options_merge():
    from mmcirc.cli.train import parse_args

    args = parse_args(['c.py', '--cfg-options', 'a=1', '--cfg-options', 'b=2', 'a=3'])
    assert args.cfg_options == dict(a=3, b=2)


def test_a_repeated_shape_is_a_usage_error(capsys):
    from mmcirc.cli.pytorch2onnx import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(['c.py', '--out', 'm.onnx', '--shape', '64', '64', '--shape', '32', '32'])
    assert exc.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith('error: --shape was given twice: give it once')
    )


@pytest.mark.parametrize('tool', ['bccb_score', 'vis_circulant', 'vis_cores'])
def test_a_repeated_img_of_the_one_image_attention_tools_is_a_usage_error(tool, capsys):
    parse_args = importlib.import_module(f'mmcirc.cli.{tool}').parse_args
    assert parse_args(['c.py', '--img', 'a.png']).img == 'a.png'
    with pytest.raises(SystemExit) as exc:
        parse_args(['c.py', '--img', 'a.png', '--img', 'b.png'])
    assert exc.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith('error: --img was given twice: give it once')
    )


def test_a_repeated_get_flops_shape_is_a_usage_error(capsys):
    from mmcirc.cli.get_flops import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(['c.py', '--shape', '64', '--shape', '32', '48'])
    assert exc.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith('error: --shape was given twice: give it once')
    )


def test_repeated_plot_complexity_sizes_and_models_add_up():
    from mmcirc.cli.plot_complexity import parse_args

    args = parse_args(
        ['--sizes', '64', '--sizes', '96', '128', '--models', 'pvt_s', '--models', 'swin_t']
    )
    assert (args.sizes, args.models) == ([64, 96, 128], ['pvt_s', 'swin_t'])
    assert parse_args([]).sizes == [224, 320, 512, 768, 1024, 1536, 2048]


def test_repeated_main_job_seeds_lists_add_up():
    from mmcirc.cli.main_job_seeds import parse_args

    args = parse_args(['--seeds', '3', '--seeds', '4', '--jobs', 'seg', '--jobs', 'det'])
    assert (args.seeds, args.jobs, args.attentions) == (
        [3, 4],
        ['seg', 'det'],
        ['circulant', 'sra', 'core'],
    )
