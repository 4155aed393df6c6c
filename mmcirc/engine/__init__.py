"""Runner-side pieces: safe checkpoint loading and atomic checkpoint saving (opt-in:
:class:`SafeCheckpointIOHook` or the ``install_*`` calls), training hooks, the compiled
backbone (:mod:`mmcirc.engine.compile`)."""

from .checkpoint import (
    MMENGINE_CHECKPOINT_GLOBALS,
    AtomicLocalBackend,
    SafeCheckpointIOHook,
    UnsafeCheckpointError,
    find_resumable_checkpoint,
    install_atomic_saving,
    install_safe_loader,
    load_from_local,
    trust_checkpoint,
)
from .compile import CompileBackboneHook, add_compile_hook, compile_backbone
from .hooks import NestedCoreHook, core_count_choices

__all__ = [
    'AtomicLocalBackend',
    'CompileBackboneHook',
    'MMENGINE_CHECKPOINT_GLOBALS',
    'NestedCoreHook',
    'SafeCheckpointIOHook',
    'UnsafeCheckpointError',
    'add_compile_hook',
    'compile_backbone',
    'core_count_choices',
    'find_resumable_checkpoint',
    'install_atomic_saving',
    'install_safe_loader',
    'load_from_local',
    'trust_checkpoint',
]
