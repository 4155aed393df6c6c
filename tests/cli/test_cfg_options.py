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


def test_infer_highres_reads_them_alike():
    from mmcirc.cli import infer_highres

    assert infer_highres.parse_args(['cfg.py', '--demo', 'astronaut', *ARGV]).cfg_options == WANT


def test_an_item_without_equals_is_a_usage_error_naming_it(capsys):
    parser = add_cfg_options(argparse.ArgumentParser())
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(['--cfg-options', 'a=1', 'train_cfg.max_iters'])
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith('usage') is False]
    assert exit_.value.code == 2 and "'train_cfg.max_iters' is not key=value" in line


TOY = 'configs/toy/ca_pvt_t_retinanet_toy.py'


@pytest.mark.parametrize(
    'options,text',
    [
        ({'train_cfg.max_iters': 2.5}, 'train_cfg.max_iters must be a whole number (an int)'),
        ({'train_cfg.max_iters': 'two'}, 'train_cfg.max_iters must be a whole number (an int)'),
        ({'optim_wrapper.optimizer.lr': 'fast'}, 'optim_wrapper.optimizer.lr must be a number'),
        ({'train_cfg.val_interval': 1.5}, 'train_cfg.val_interval must be a whole number'),
        (
            {'train_dataloader.sampler.shuffle': 'yes'},
            'train_dataloader.sampler.shuffle must be true',
        ),
    ],
)
def test_a_value_of_another_kind_than_the_configs_names_the_key(options, text):
    from helpers import REPO

    with pytest.raises(ValueError) as info:
        runner.load_config(f'{REPO}/{TOY}', options)
    ((key, value),) = options.items()
    assert str(info.value).startswith(f'cfg_options {key}={value!r}: {text}')
    assert '\n' not in str(info.value)


def test_values_of_the_same_kind_and_new_keys_are_taken():
    from helpers import REPO

    cfg = runner.load_config(
        f'{REPO}/{TOY}',
        {'train_cfg.max_iters': 3, 'optim_wrapper.optimizer.lr': 1, 'model.backbone.new': 'x',
         'optim_wrapper.optimizer.weight_decay': None},
    )  # fmt: skip
    assert cfg.train_cfg.max_iters == 3 and cfg.optim_wrapper.optimizer.lr == 1
    assert cfg.model.backbone.new == 'x'


def test_train_tool_with_a_fractional_max_iters_is_one_error_line(tmp_path):
    from helpers import REPO, run_tool

    proc = run_tool(
        ['tools/train.py', TOY, '--work-dir', str(tmp_path), '--cfg-options',
         'train_cfg.max_iters=2.5'],
        cwd=REPO, check=False, env=dict(MMCIRC_DEBUG='0'),
    )  # fmt: skip
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr[-2000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith('error:')] == [
        'error: cfg_options train_cfg.max_iters=2.5: train_cfg.max_iters must be a whole number '
        "(an int), as the config's 500"
    ]
