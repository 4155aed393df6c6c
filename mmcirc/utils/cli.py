"""The command helpers' old address, kept for the commands not yet moved into
:mod:`mmcirc.cli` (``mmcirc/benchmark/suites/*``, ``mmcirc/apis/highres_cli.py``):
:class:`~mmcirc.cli.common.CLIError`, :func:`~mmcirc.cli.common.main_guard`,
:func:`~mmcirc.cli.common.parse_hw`. Removed when they move; new code imports
:mod:`mmcirc.cli.common`.
"""

from mmcirc.cli.common import CLIError, main_guard, parse_hw

__all__ = ['CLIError', 'main_guard', 'parse_hw']
