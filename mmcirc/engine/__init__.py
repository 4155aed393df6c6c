"""Runner-side pieces: safe checkpoint loading and atomic checkpoint saving (opt-in:
:class:`SafeCheckpointIOHook` or the ``install_*`` calls), training hooks, the compiled
backbone (:mod:`mmcirc.engine.compile`), one training run per work dir
(:mod:`mmcirc.engine.work_dir_lock`)."""

from .checkpoint import (
    MMENGINE_CHECKPOINT_GLOBALS,
    AtomicLocalBackend,
    CheckpointReadError,
    SafeCheckpointIOHook,
    UnsafeCheckpointError,
    find_resumable_checkpoint,
    install_atomic_saving,
    install_safe_loader,
    load_from_local,
    remove_interrupted_saves,
    trust_checkpoint,
    unreadable_reason,
)
from .compile import CompileBackboneHook, add_compile_hook, compile_backbone
from .hooks import NestedCoreHook, core_count_choices
from .plain_state import from_plain, to_plain
from .work_dir_lock import WorkDirBusyError, WorkDirLock, launcher_rank

__all__ = [
    'MMENGINE_CHECKPOINT_GLOBALS',
    'AtomicLocalBackend',
    'CheckpointReadError',
    'CompileBackboneHook',
    'NestedCoreHook',
    'SafeCheckpointIOHook',
    'UnsafeCheckpointError',
    'WorkDirBusyError',
    'WorkDirLock',
    'add_compile_hook',
    'compile_backbone',
    'core_count_choices',
    'find_resumable_checkpoint',
    'from_plain',
    'install_atomic_saving',
    'install_safe_loader',
    'launcher_rank',
    'load_from_local',
    'remove_interrupted_saves',
    'to_plain',
    'trust_checkpoint',
    'unreadable_reason',
]
