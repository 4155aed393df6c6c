"""What ``tools/train.py`` and ``tools/test.py`` share: the run's config (the library from
its ``default_scope``), the common flags, and mmengine's Runner built and run so that a
distributed job exits cleanly.
"""

import os
import os.path as osp

from mmcirc.apis.builder import load_model_config
from mmcirc.cli.common import CLIError, add_cfg_options, check_output_dir


def load_config(path, cfg_options=None, work_dir=None, launcher='none'):
    """The run's config (:func:`mmcirc.apis.builder.load_model_config`, ``cfg_options``
    merged) with the ``launcher`` and the ``work_dir`` (given, the config's, else
    ``./work_dirs/<config name>``, checked writable) settled."""
    cfg = load_model_config(path, cfg_options)
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    check_output_dir(cfg.work_dir, '--work-dir' if work_dir is not None else 'work_dir')
    return cfg


def apply_common_args(parser):
    """``--work-dir``, ``--cfg-options``, ``--launcher``, ``--local-rank``."""
    parser.add_argument('--work-dir', help='directory for logs, checkpoints and results')
    add_cfg_options(parser, 'train_cfg.max_iters=10')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher',
    )
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    return parser


def parse_run_args(parser, argv=None):
    """``parser``'s arguments with :func:`apply_common_args`' (``LOCAL_RANK`` set from
    ``--local-rank`` unless the launcher set it; ``--launcher slurm`` outside a Slurm task
    refused: :func:`check_slurm_env`)."""
    args = apply_common_args(parser).parse_args(argv)
    if args.launcher == 'slurm':
        check_slurm_env()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


#: What srun sets for each task and ``--launcher slurm`` reads (mmengine's as well).
SLURM_VARS = ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID', 'SLURM_NODELIST')


def check_slurm_env():
    """``--launcher slurm`` outside a Slurm task: one line naming what is missing."""
    missing = [name for name in SLURM_VARS if name not in os.environ]
    if missing:
        raise CLIError(
            f'--launcher slurm: {", ".join(missing)} not set; start the command with srun '
            '(tools/slurm_train.sh, tools/slurm_test.sh)'
        )


def slurm_env_to_torch(port=None):
    """torch.distributed's variables from Slurm's, as mmengine's ``_init_dist_slurm``
    sets them before it joins NCCL (``MASTER_PORT``: ``port``, the config's
    ``env_cfg.dist_cfg.port``, if given, else as set, else 29500)."""
    import subprocess

    nodes = os.environ['SLURM_NODELIST']
    if 'MASTER_ADDR' not in os.environ:
        try:
            hosts = subprocess.run(
                ['scontrol', 'show', 'hostnames', nodes], capture_output=True, text=True
            )
        except OSError as err:
            raise CLIError(f'--launcher slurm: scontrol: {err.strerror}') from None
        if hosts.returncode != 0 or not hosts.stdout.split():
            why = (hosts.stderr.strip().splitlines() or ['no hosts'])[0]
            raise CLIError(f'--launcher slurm: scontrol show hostnames {nodes}: {why}')
        os.environ['MASTER_ADDR'] = hosts.stdout.split()[0]
    if port is not None:
        os.environ['MASTER_PORT'] = str(port)
    os.environ.setdefault('MASTER_PORT', '29500')
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['LOCAL_RANK'] = os.environ['SLURM_LOCALID']


def build_runner(cfg):
    """Build the Runner the way mmdet/mmseg/mmpretrain tools do; mmengine's report of
    weights that do not fit (``load_from``, ``init_cfg``) is one line in its log
    (:class:`mmcirc.apis.weights.OneLineLoadSummary`), the loading itself mmengine's."""
    import torch
    import torch.distributed as dist
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    if cfg.get('launcher', 'none') != 'none' and not torch.cuda.is_available():
        # mmengine assumes GPUs in distributed runs: init_dist calls cuda.set_device and
        # the default DDP wrapper passes device_ids. Without GPUs, join the torchrun group
        # (or the srun tasks') over gloo here (the Runner reuses it) and wrap with DDP on
        # the CPU.
        if cfg.launcher == 'slurm':
            slurm_env_to_torch(cfg.get('env_cfg', {}).get('dist_cfg', {}).get('port'))
        if cfg.launcher in ('pytorch', 'slurm') and not dist.is_initialized():
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
    from mmcirc.apis.weights import OneLineLoadSummary

    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    runner.logger.addFilter(OneLineLoadSummary())
    if dist.is_initialized():
        print(
            f'[mmcirc] process rank {dist.get_rank()} of world size {dist.get_world_size()} '
            f'({dist.get_backend()})',
            flush=True,
        )
    return runner


def run_and_release(runner, method: str):
    """``runner.train()`` / ``runner.test()`` / ``runner.val()``, then leave the
    distributed group cleanly (mmengine never destroys the group it, or
    :func:`build_runner`, joined): :func:`mmcirc.distributed.leaving_group`."""
    from mmcirc.distributed import leaving_group

    with leaving_group():
        return getattr(runner, method)()
