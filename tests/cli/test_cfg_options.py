"""mmcirc.cli.common.add_cfg_options: every command's ``--cfg-options`` is mmengine's
``DictAction`` (key=value pairs read as Python literals into one dict)."""

import argparse

import pytest

from mmcirc.cli import attention_tools, pytorch2onnx, runner
from mmcirc.cli.common import add_cfg_options

ARGV = ['--cfg-options', 'model.backbone.depth=2', 'a=[1,2]', 'name=x']
WANT = {'model.backbone.depth': 2, 'a': [1, 2], 'name': 'x'}


def test_pairs_become_one_dict_of_literals():
    parser = add_cfg_options(argparse.ArgumentParser(), 'train_cfg.max_iters=10')
    assert parser.parse_args(ARGV).cfg_options == WANT
    assert parser.parse_args([]).cfg_options is None
    assert '(e.g. train_cfg.max_iters=10)' in ' '.join(parser.format_help().split())


@pytest.mark.parametrize(
    'parse',
    [
        lambda argv: runner.apply_common_args(argparse.ArgumentParser()).parse_args(argv),
        lambda argv: attention_tools.add_common_args(argparse.ArgumentParser(), 't').parse_args(
            ['cfg.py', '--demo', 'astronaut', *argv]
        ),
        lambda argv: pytorch2onnx.parse_args(
            ['cfg.py', '--shape', '8', '8', '--out', 'x.onnx', *argv]
        ),
    ],
    ids=['train/test', 'attention tools', 'pytorch2onnx'],
)
def test_every_command_reads_them_alike(parse):
    assert parse(ARGV).cfg_options == WANT
