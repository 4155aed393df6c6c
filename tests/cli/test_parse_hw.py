"""mmcirc.cli.common.parse_hw: the tools' one size format, S or HxW (height first)."""

import pytest

from mmcirc.cli.common import CLIError, parse_hw


def test_square_and_height_first():
    assert parse_hw('224', '--sizes', 16) == (224, 224)
    assert parse_hw('64x96', '--sizes', 32) == (64, 96)


@pytest.mark.parametrize('text', ['0', '17', '8x16', 'axb', '1x2x3', ''])
def test_bad_sizes_name_the_flag_and_the_rule(text):
    with pytest.raises(
        CLIError, match=r'^--sizes: each size must be S or HxW with multiples of 16'
    ):
        parse_hw(text, '--sizes', 16)
