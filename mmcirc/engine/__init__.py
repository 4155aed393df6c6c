"""Runner-side pieces: safe checkpoint loading and training hooks."""
from .checkpoint import (MMENGINE_CHECKPOINT_GLOBALS, UnsafeCheckpointError,
                         install_safe_loader, load_from_local_safely, trust_checkpoint)
from .hooks import NestedCoreHook, core_count_choices

__all__ = ['NestedCoreHook', 'core_count_choices', 'MMENGINE_CHECKPOINT_GLOBALS', 'UnsafeCheckpointError', 'install_safe_loader',
           'load_from_local_safely', 'trust_checkpoint']
