"""tools/slurm_train.sh and tools/slurm_test.sh on a real one-machine Slurm
(tools/misc/local_slurm.sh: Debian's slurm-wlm and munge) with a partition without GPUs:
``GPUS=2 GPUS_PER_NODE=0`` runs two srun tasks that join a gloo group from Slurm's
variables (``--launcher slurm``). The toy detector's losses are torchrun's
(tools/dist_train.sh with 2 processes), the trained checkpoint evaluates, and a batch job
requeued mid-run resumes to the weights of the uninterrupted run.
The tests skip only where the cluster cannot be set up (not root, no apt-get packages).
"""

import contextlib
import importlib
import os
import os.path as osp
import socket
import subprocess
import sys
import time

import pytest
import torch
from helpers import REPO, assert_metric, evaluated_metrics, run_dirs, run_tool, train_scalars

CONFIG = osp.join(REPO, 'configs', 'toy', 'ca_pvt_t_retinanet_toy.py')
SCRIPT = osp.join(REPO, 'tools', 'misc', 'local_slurm.sh')
HOOKS_DIR = osp.join(REPO, 'tests', 'fixtures', 'hooks')
#: where the ports of the cluster (slurmctld's, slurmd's) and of the gloo groups are sought
PORTS = range(31000, 31100)
ITERS = 4
#: 4 iterations of 2 images a rank, a loss logged at each, one checkpoint, no validation
#: while training; the data loaded in the ranks themselves
TRAIN_OPTIONS = [
    '--cfg-options',
    f'train_cfg.max_iters={ITERS}',
    'train_cfg.val_interval=100',
    f'default_hooks.checkpoint.interval={ITERS}',
    'default_hooks.logger.interval=1',
    'train_dataloader.batch_size=2',
    'train_dataloader.num_workers=0',
    'train_dataloader.persistent_workers=False',
]
#: 4 test images (2 a rank); every box kept, so that the briefly trained model is scored
TEST_OPTIONS = [
    '--cfg-options',
    'model.test_cfg.score_thr=0.0',
    'test_dataloader.batch_size=2',
    'test_dataloader.dataset.indices=4',
    'test_dataloader.num_workers=0',
    'test_dataloader.persistent_workers=False',
]
#: one intra-op thread per rank under both launchers (torchrun's default with 2 processes)
THREADS = {'OMP_NUM_THREADS': '1'}
#: srun's tasks on the partition without GPUs
TASKS = {'GPUS': '2', 'GPUS_PER_NODE': '0', 'CPUS_PER_TASK': '1'}


def _free_ports(count):
    """``count`` consecutive ports of :data:`PORTS` that nothing listens on now."""
    for first in PORTS[: len(PORTS) - count]:
        try:
            with contextlib.ExitStack() as stack:
                for port in range(first, first + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(('', port))
            return list(range(first, first + count))
        except OSError:
            continue
    raise RuntimeError(f'no {count} free ports in {PORTS}')


def _cluster(command, state, port, timeout):
    env = {'MMCIRC_SLURM_DIR': str(state), 'MMCIRC_SLURM_PORT': str(port)}
    return subprocess.run(
        ['bash', SCRIPT, command],
        check=False,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
    """The environment that points srun at a local cluster started for this module
    (``SLURM_CONF``) and gives the tasks a rendezvous port (``MASTER_PORT``); the cluster
    is stopped, its folder removed, at the end."""
    state = tmp_path_factory.mktemp('slurm') / 'cluster'
    slurmctld_port, _, master_port = _free_ports(3)
    proc = _cluster('start', state, slurmctld_port, timeout=900)
    if proc.returncode == 3:  # the script's "this machine cannot run it"
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    (export,) = [ln for ln in proc.stdout.splitlines() if ln.startswith('export SLURM_CONF=')]
    yield {'SLURM_CONF': export.split('=', 1)[1], 'MASTER_PORT': str(master_port)}
    stopped = _cluster('stop', state, slurmctld_port, timeout=120)
    assert stopped.returncode == 0 and not state.exists(), stopped.stderr


@pytest.fixture(scope='module')
def slurm_run(slurm, toy_root, tmp_path_factory):
    """The toy detector trained for 4 iterations by tools/slurm_train.sh (2 gloo tasks):
    its work dir and the command's output."""
    work = tmp_path_factory.mktemp('slurm_train') / 'work'
    proc = run_tool(
        ['tools/slurm_train.sh', 'local', 'toy', CONFIG, str(work), *TRAIN_OPTIONS],
        cwd=toy_root,
        timeout=600,
        env={**slurm, **THREADS, **TASKS},
    )
    return work, proc.stdout + proc.stderr


def _losses(work):
    rows = [r for r in train_scalars(work) if 'loss' in r]
    return [{k: v for k, v in r.items() if k.startswith('loss') or k == 'iter'} for r in rows]


def test_slurm_train_losses_equal_torchrun(slurm_run, toy_root, tmp_path):
    work, log = slurm_run
    assert '--launcher=slurm' in log and 'Distributed launcher: slurm' in log
    assert 'process rank 0 of world size 2 (gloo)' in log
    assert 'process rank 1 of world size 2 (gloo)' in log
    assert (work / f'iter_{ITERS}.pth').is_file()

    reference = tmp_path / 'torchrun'
    run_tool(
        ['tools/dist_train.sh', CONFIG, '2', '--work-dir', str(reference), *TRAIN_OPTIONS],
        cwd=toy_root,
        timeout=600,
        env={**THREADS, 'PORT': str(_free_ports(1)[0])},
    )
    expected = _losses(reference)
    assert [r['iter'] for r in expected] == list(range(1, ITERS + 1))
    assert _losses(work) == expected


def test_slurm_test_evaluates_the_checkpoint(slurm, slurm_run, toy_root, tmp_path):
    work, _ = slurm_run
    proc = run_tool(
        [
            'tools/slurm_test.sh',
            'local',
            'toy-test',
            CONFIG,
            str(work / f'iter_{ITERS}.pth'),
            '--work-dir',
            str(tmp_path / 'test'),
            *TEST_OPTIONS,
        ],
        cwd=toy_root,
        timeout=600,
        env={**slurm, **THREADS, **TASKS},
    )
    log = proc.stdout + proc.stderr
    assert 'Distributed launcher: slurm' in log
    assert 'process rank 0 of world size 2 (gloo)' in log
    assert 'process rank 1 of world size 2 (gloo)' in log
    assert_metric(evaluated_metrics(tmp_path / 'test'), 'coco/bbox_mAP', 1)


def _scontrol_show(slurm, *entity):
    """{field: value} of ``scontrol show job JOBID`` or ``scontrol show node``."""
    proc = subprocess.run(
        ['scontrol', 'show', *entity],
        env={**os.environ, **slurm},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(f.split('=', 1) for f in proc.stdout.split() if '=' in f)


def _wait(what, done, timeout):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f'{what}: not within {timeout} s'
        time.sleep(0.5)


def test_sbatch_requeue_resumes_to_the_uninterrupted_weights(slurm, toy_root, tmp_path):
    """A batch job (``sbatch --requeue``) running ``slurm_train.sh ... --resume``, requeued
    after iteration 3 (``scontrol requeue``, as a preemption does): Slurm starts its script
    again, which resumes from ``iter_2.pth`` and ends with the weights of the same job run
    uninterrupted (rtol 1e-6: see test_multinode.py's restart test for why that is the
    bound). Drop path is off: mmengine's checkpoints do not hold the random generators, so
    a resumed run draws other masks (docs/training.md, 'Restarts'). Slurm holds a requeued
    job two minutes before it is eligible; the test moves its start to now."""
    marker, work, reference = tmp_path / 'requeued', tmp_path / 'work', tmp_path / 'reference'
    cfg = tmp_path / 'requeue.py'
    cfg.write_text(
        f"_base_ = '{CONFIG}'\n"
        "custom_imports = dict(imports=['mmcirc', 'requeue_hook'], allow_failed_imports=False)\n"
        f"custom_hooks = [dict(type='RequeueJobHook', after_iter=3, marker='{marker}')]\n"
    )
    options = [
        *TRAIN_OPTIONS, 'default_hooks.checkpoint.interval=2', 'model.backbone.drop_path_rate=0.0'
    ]  # fmt: skip
    train = ['tools/slurm_train.sh', 'local', 'toy-requeue']
    run_tool(
        [*train, CONFIG, str(reference), *options], toy_root, 600, {**slurm, **THREADS, **TASKS}
    )
    script = tmp_path / 'job.sh'
    command = ['bash', osp.join(REPO, train[0]), *train[1:], str(cfg), str(work), '--resume']
    script.write_text('#!/bin/bash\n' + ' '.join([*command, *options]) + '\n')
    env = {
        **os.environ, **slurm, **THREADS, **TASKS, 'PYTHON': sys.executable,
        'PYTHONPATH': os.pathsep.join([REPO, HOOKS_DIR, os.environ.get('PYTHONPATH', '')]),
    }  # fmt: skip
    log = tmp_path / 'job.log'
    submit = ['sbatch', '--parsable', '--requeue', '--open-mode=append', '-p', 'local']
    submit += ['-n', '2', '-c', '1', '-o', str(log), str(script)]
    proc = subprocess.run(
        submit, check=False, cwd=toy_root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(';')[0]
    _wait('the requeue', lambda: _scontrol_show(slurm, 'job', job)['JobState'] == 'PENDING'
          and marker.exists(), 300)  # fmt: skip
    # slurmd revokes the killed job's credential stamped in whole seconds and refuses a start
    # stamped in the same second; slurmctld then ends the job FAILED unrun (a "termination
    # race"). The start moves to now once the node is idle, two seconds later.
    _wait('the idle node', lambda: _scontrol_show(slurm, 'node')['State'] == 'IDLE', 60)
    time.sleep(2)
    subprocess.run(['scontrol', 'update', f'JobId={job}', 'StartTime=now'], env=env, check=True)
    finished = ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL')
    _wait('the job', lambda: _scontrol_show(slurm, 'job', job)['JobState'] in finished, 600)
    state, text = _scontrol_show(slurm, 'job', job), log.read_text()
    with open(osp.join(osp.dirname(slurm['SLURM_CONF']), 'slurmctld.log')) as f:
        said = [ln for ln in f if f'JobId={job} ' in ln + ' ']  # what slurmctld did with it
    restarted = state['JobState'] == 'COMPLETED' and state['Restarts'] == '1'
    assert restarted, (state, said, text[-2000:])
    assert len(run_dirs(work)) == 2 and 'resumed epoch: 0, iter: 2' in text, text[-3000:]
    final, expected = (
        torch.load(w / f'iter_{ITERS}.pth', map_location='cpu', weights_only=True)['state_dict']
        for w in (work, reference)
    )
    assert final.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, rtol=1e-6, atol=0, msg=name)


@pytest.mark.parametrize('script', ['tools/slurm_train.sh', 'tools/slurm_test.sh'])
def test_srun_command_lines(script, tmp_path):
    """The srun options mmdet's scripts pass on GPU partitions, and none of the GPU ones
    with GPUS_PER_NODE=0 (an srun on PATH that prints its arguments)."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'srun').write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / 'srun').chmod(0o755)
    path = f'{bin_dir}{os.pathsep}{os.environ["PATH"]}'
    gpu = run_tool(
        [script, 'gpu', 'job', 'CFG', 'W', '--x'], cwd=tmp_path, env={'PATH': path, 'GPUS': '16'}
    ).stdout.splitlines()
    assert gpu[:2] == ['-p', 'gpu'] and '--job-name=job' in gpu
    for option in ('--gres=gpu:8', '--ntasks=16', '--ntasks-per-node=8', '--cpus-per-task=5'):
        assert option in gpu
    assert gpu[-2:] == ['--launcher=slurm', '--x']
    cpu = run_tool(
        [script, 'cpu', 'job', 'CFG', 'W'],
        cwd=tmp_path,
        env={'PATH': path, 'GPUS': '4', 'GPUS_PER_NODE': '0', 'CPUS_PER_TASK': '2'},
    ).stdout.splitlines()
    assert '--ntasks=4' in cpu and '--cpus-per-task=2' in cpu
    assert not [a for a in cpu if a.startswith(('--gres', '--ntasks-per-node'))]


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_launcher_slurm_outside_slurm_is_one_line_error(tool, run_main, tmp_path, monkeypatch):
    main = importlib.import_module(f'mmcirc.cli.{tool}').main
    for name in ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID', 'SLURM_NODELIST'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('SLURM_NTASKS', '2')
    positional = [CONFIG] if tool == 'train' else [CONFIG, 'x.pth']
    proc = run_main(main, [*positional, '--launcher', 'slurm'], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        (
            'error: --launcher slurm: SLURM_PROCID, SLURM_LOCALID, SLURM_NODELIST not set; '
            'start the command with srun (tools/slurm_train.sh, tools/slurm_test.sh)'
        )
    ]
