"""Config loading and CLI conventions shared by ``tools/train.py`` and ``tools/test.py``.

The tools follow mmdet's command line for every library; which library runs a config
is read from its ``default_scope`` (``mmdet``, ``mmseg`` or ``mmpretrain``).
"""

import functools
import os
import os.path as osp
import pickle
import sys

from mmcirc.registry import LIBRARIES


class CLIError(Exception):
    """An error the tools report as one line (what and where), without a traceback."""


def parse_hw(text: str, flag: str, multiple: int = 1):
    """A size flag's value, ``S`` (square) or ``HxW``, as (H, W): both >= ``multiple`` and
    multiples of it; anything else is a one-line ``CLIError`` naming ``flag``."""
    try:
        hw = tuple(int(p) for p in str(text).lower().split('x'))
    except ValueError:
        hw = ()
    if len(hw) == 1:
        hw = hw * 2
    if len(hw) != 2 or any(s < multiple or s % multiple for s in hw):
        raise CLIError(
            f'{flag}: each size must be S or HxW with multiples of {multiple} '
            f'(>= {multiple}), got {text!r}'
        )
    return hw


def load_config(path, cfg_options=None, work_dir=None, launcher='none'):
    """Load ``path`` with mmengine, merge overrides and settle ``work_dir``.

    Raises :class:`CLIError` for a missing file or a ``default_scope`` that is not one
    of :data:`LIBRARIES`.
    """
    from mmengine.config import Config

    if not osp.isfile(path):
        raise CLIError(f'config file not found: {path}')
    import mmcirc  # noqa: F401  (registers models, hooks and the safe checkpoint loader)

    cfg = Config.fromfile(path)
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope')
    if scope not in LIBRARIES:
        raise CLIError(
            f'{path}: default_scope={scope!r}; expected one of {LIBRARIES} '
            '(inherit an mmdet::, mmseg:: or mmpretrain:: base config)'
        )
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    return cfg


def apply_common_args(parser):
    """Arguments every tool takes: ``--work-dir``, ``--cfg-options``, ``--launcher``."""
    from mmengine.config import DictAction

    parser.add_argument('--work-dir', help='directory for logs, checkpoints and results')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value (e.g. train_cfg.max_iters=10)',
    )
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher',
    )
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    return parser


def set_local_rank(args):
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)


def build_runner(cfg):
    """Build the Runner the way mmdet/mmseg/mmpretrain tools do."""
    import torch
    import torch.distributed as dist
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    if cfg.get('launcher', 'none') != 'none' and not torch.cuda.is_available():
        # mmengine assumes GPUs in distributed runs: init_dist calls cuda.set_device and
        # the default DDP wrapper passes device_ids. Without GPUs, join the torchrun group
        # over gloo here (the Runner reuses it) and wrap with DDP on the CPU.
        if cfg.launcher == 'pytorch' and not dist.is_initialized():
            dist.init_process_group(backend='gloo')
        cfg.setdefault(
            'model_wrapper_cfg',
            dict(
                type='MMDistributedDataParallel',
                device_ids=None,
                broadcast_buffers=False,
                find_unused_parameters=cfg.get('find_unused_parameters', False),
            ),
        )
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    if dist.is_initialized():
        print(
            f'[mmcirc] process rank {dist.get_rank()} of world size {dist.get_world_size()} '
            f'({dist.get_backend()})',
            flush=True,
        )
    return runner


def run_and_release(runner, method: str):
    """``runner.train()`` / ``runner.test()`` / ``runner.val()``, then leave the
    distributed group cleanly.

    mmengine never destroys the process group it (or :func:`build_runner`) joined; the
    gloo group's threads are then still running when the interpreter tears down, and
    a process that did all its work can die with ``terminate called without an
    active exception`` (SIGABRT), which torchrun reports as a failed job. After a
    successful run every rank waits for the others (so none tears down a group a peer
    still uses) and the group is destroyed, joining its threads while the interpreter
    is still whole; after a failure it is destroyed without waiting (the peers may be
    gone).
    """
    import torch.distributed as dist

    try:
        result = getattr(runner, method)()
    except BaseException:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        raise
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return result


#: Set to 1 to see the traceback behind a tool's one-line ``error:``.
DEBUG_ENV = 'MMCIRC_DEBUG'


def error_line(err: BaseException) -> str:
    """The one line a tool prints for ``err``: its message's first line (a registry
    ``KeyError`` without mmengine's "Please check ..." advice)."""
    message = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    message = message.split('. Please check')[0].strip()
    return message.splitlines()[0] if message else type(err).__name__


def main_guard(func):
    """Run ``func``; print expected failures (bad arguments, files, config values) as one
    ``error:`` line and exit 1. ``MMCIRC_DEBUG=1`` lets them raise with their traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (CLIError, FileNotFoundError, pickle.UnpicklingError, ValueError, TypeError) as err:
            if os.environ.get(DEBUG_ENV, '') not in ('', '0'):
                raise
            print(f'error: {error_line(err)}', file=sys.stderr)
            sys.exit(1)
        except KeyError as err:  # mmengine: "X is not in the mmdet::model registry ..."
            message = str(err.args[0]) if err.args else ''
            if ' registry' not in message or os.environ.get(DEBUG_ENV, '') not in ('', '0'):
                raise
            print(f'error: {error_line(err)}', file=sys.stderr)
            sys.exit(1)

    return wrapper
