"""mmcirc.cli.override_flags: the tools' backbone override flags read back as the
library validator's overrides."""

import argparse

import pytest

from mmcirc.cli.override_flags import add_override_args, overrides_from_args


def test_the_tool_flags_read_back_as_validated_overrides():
    parser = add_override_args(argparse.ArgumentParser())
    args = parser.parse_args(['--num-cores', 'edge', '--stage-attentions', 'core,circulant'])
    assert overrides_from_args(args) == dict(
        num_cores='edge', stage_attentions=('core', 'circulant')
    )
    assert overrides_from_args(parser.parse_args([])) == {}
    with pytest.raises(ValueError, match='^scale must'):
        overrides_from_args(parser.parse_args(['--scale', 'x']))
