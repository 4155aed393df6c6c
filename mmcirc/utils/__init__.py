"""Helpers shared by mmcirc's command-line tools."""

from .cli import LIBRARIES, apply_common_args, load_config, main_guard

__all__ = ['LIBRARIES', 'apply_common_args', 'load_config', 'main_guard']
