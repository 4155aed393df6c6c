"""mmcirc.cli.common: the tools' backbone override flags read back as the
library validator's overrides, and the library's messages about them in flag words."""

import argparse

import pytest

from mmcirc.apis.overrides import validate_overrides
from mmcirc.cli.common import CLIError, add_override_args, as_cli_errors, overrides_from_args


def test_the_tool_flags_read_back_as_validated_overrides():
    parser = add_override_args(argparse.ArgumentParser())
    args = parser.parse_args(['--num-cores', 'edge', '--stage-attentions', 'core,circulant'])
    assert overrides_from_args(args) == dict(
        num_cores='edge', stage_attentions=('core', 'circulant')
    )
    assert overrides_from_args(parser.parse_args([])) == {}
    with pytest.raises(ValueError, match='^scale must'):
        overrides_from_args(parser.parse_args(['--scale', 'x']))


@pytest.mark.parametrize(
    'kwargs,text',
    [
        (dict(boundary='wrap'), "--boundary must be one of ('circular', 'zero'), got 'wrap'"),
        (
            dict(scale='log'),
            "--scale must be one of ('sqrt_n', 'n') or a positive float, got 'log'",
        ),
        (
            dict(num_cores='0'),
            "--num-cores must be an int in [1, num_cores_max] or a preset in ('mobile', 'edge', "
            "'server') {'mobile': 8, 'edge': 32, 'server': 64}, got '0'",
        ),
    ],
)
def test_library_errors_become_flag_errors(kwargs, text):
    with pytest.raises(CLIError) as err:
        with as_cli_errors():
            validate_overrides(**kwargs)
    assert str(err.value) == text
