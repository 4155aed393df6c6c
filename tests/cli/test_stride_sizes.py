"""mmcirc.cli.common.check_stride_sizes: the backbone benchmarks' square sides."""

import pytest

from mmcirc.cli.common import CLIError, check_stride_sizes


def test_multiples_of_the_stride_pass():
    check_stride_sizes([32, 1024, 2048])


@pytest.mark.parametrize('sizes', [[0], [16], [1000], [1024, 33]])
def test_other_sides_are_one_line_naming_the_flag(sizes):
    with pytest.raises(CLIError, match=r'^--sizes must be multiples of 32 .*got \[') as err:
        check_stride_sizes(sizes)
    assert '\n' not in str(err.value)
