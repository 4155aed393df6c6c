"""tools/dist_train.sh and tools/dist_test.sh on one node with two processes and over
several nodes: two torchrun agents on this machine are two nodes (``NNODES=2
NODE_RANK=0|1 MASTER_ADDR=127.0.0.1``, one process each, gloo on the CPU). The toy
detector (mmdet's RetinaNet, tiny, through the main job's config) trains and tests on
one node with two processes, and on two nodes as on that one node; a node whose agent is killed stops
the job; ``MAX_RESTARTS`` with ``--resume`` restarts a job whose rank was killed and ends
with the weights of the uninterrupted run.

The reference is one node with two processes (``tools/dist_train.sh CONFIG 2``), run once
for the module. Every run has one intra-op thread per process (torchrun sets it only for
several processes per node), so that the same operations round alike.
"""

import json
import os
import os.path as osp
import random
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from helpers import (
    FIXTURE_CONFIGS,
    REPO,
    assert_metric,
    evaluated_metrics,
    run_dirs,
    run_tool,
    train_iters,
    train_scalars,
)

CONFIG = osp.join(FIXTURE_CONFIGS, 'retinanet_r18_tiny_toy.py')
HOOKS_DIR = osp.join(REPO, 'tests', 'fixtures', 'hooks')
#: where the rendezvous ports are sought
PORTS = range(32000, 33000)
#: the fixture config's schedule: 4 iterations, a checkpoint every 2, validation at the end
ITERS = 4
THREADS = {'OMP_NUM_THREADS': '1'}


def _free_port():
    """A port of :data:`PORTS` that nothing listens on, tried in random order (so that
    jobs started at once rarely pick the same)."""
    for port in random.sample(PORTS, len(PORTS)):
        with socket.socket() as sock:
            try:
                sock.bind(('127.0.0.1', port))
            except OSError:
                continue
            return port
    raise RuntimeError(f'no free port in {PORTS}')


def _start_node(node_rank, args, cwd, port, log, env=None):
    """One node: ``tools/dist_train.sh`` (or dist_test.sh) with one process, as node
    ``node_rank`` of 2; the script execs torchrun, so the returned process is the agent."""
    full_env = dict(
        os.environ,
        PYTHONUNBUFFERED='1',
        PYTHON=sys.executable,
        NNODES='2',
        NODE_RANK=str(node_rank),
        MASTER_ADDR='127.0.0.1',
        PORT=str(port),
        **THREADS,
        **(env or {}),
    )
    full_env['PYTHONPATH'] = os.pathsep.join([REPO, full_env.get('PYTHONPATH', '')])
    return subprocess.Popen(
        ['bash', osp.join(REPO, args[0]), *args[1:]],
        cwd=cwd,
        env=full_env,
        stdout=open(log, 'w'),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _two_nodes(args, cwd, logs, env=None, timeout=600):
    """Both nodes of a job to their end: (return codes, logs' text)."""
    port = _free_port()
    procs = [_start_node(rank, args, cwd, port, logs / f'node{rank}.log', env) for rank in (0, 1)]
    try:
        codes = [proc.wait(timeout=timeout) for proc in procs]
    finally:
        _kill(procs)
    return codes, [(logs / f'node{rank}.log').read_text() for rank in (0, 1)]


def _kill(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # the agent; its processes follow it (dist_train.sh)
            proc.wait()
        proc.stdout and proc.stdout.close()


def _children(pid):
    try:
        with open(f'/proc/{pid}/task/{pid}/children') as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _gone(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except OSError:
        return True


def _losses(work, run=-1):
    """{iteration: every logged loss term} of one training run in ``work``."""
    return {
        r['iter']: {k: v for k, v in r.items() if k.startswith('loss')}
        for r in train_scalars(work, run)
        if 'loss' in r
    }


def _weights(path):
    return torch.load(path, map_location='cpu', weights_only=False)['state_dict']


@pytest.fixture(scope='module')
def reference_run(toy_root, tmp_path_factory):
    """One node, two processes: the work dir of the uninterrupted seeded run, its log."""
    work = tmp_path_factory.mktemp('one_node') / 'work'
    proc = run_tool(
        ['tools/dist_train.sh', CONFIG, '2', '--work-dir', str(work)],
        cwd=toy_root,
        env={**THREADS, 'PORT': str(_free_port())},
    )
    assert train_iters(work) == list(range(1, ITERS + 1))
    return work, proc.stdout + proc.stderr


@pytest.fixture(scope='module')
def reference(reference_run):
    return reference_run[0]


def test_one_node_trains_on_two_processes(reference_run):
    work, log = reference_run  # the process group is only in the log
    assert 'Distributed training: True' in log
    assert 'process rank 0 of world size 2' in log and 'process rank 1 of world size 2' in log
    (val,) = [r for r in train_scalars(work) if 'coco/bbox_mAP' in r]
    assert_metric(val, 'coco/bbox_mAP', 1)
    assert (work / f'iter_{ITERS}.pth').is_file()


def test_one_node_tests_on_two_processes(reference, toy_root, tmp_path):
    """tools/dist_test.sh: 2 processes evaluate the reference's checkpoint and exit 0."""
    proc = run_tool(
        [
            'tools/dist_test.sh',
            CONFIG,
            str(reference / f'iter_{ITERS}.pth'),
            '2',
            '--work-dir',
            str(tmp_path / 'test'),
        ],
        cwd=toy_root,
        env={**THREADS, 'PORT': str(_free_port())},
    )
    log = proc.stdout + proc.stderr
    assert 'process rank 0 of world size 2' in log and 'process rank 1 of world size 2' in log
    assert_metric(evaluated_metrics(tmp_path / 'test'), 'coco/bbox_mAP', 1)


def test_two_nodes_train_as_one_node(reference, toy_root, tmp_path):
    work = tmp_path / 'work'
    codes, logs = _two_nodes(
        ['tools/dist_train.sh', CONFIG, '1', '--work-dir', str(work)], toy_root, tmp_path
    )
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert 'process rank 0 of world size 2' in logs[0]
    assert 'process rank 1 of world size 2' in logs[1]
    assert _losses(work) == _losses(reference)
    final, expected = (
        _weights(work / f'iter_{ITERS}.pth'),
        _weights(reference / f'iter_{ITERS}.pth'),
    )
    assert final.keys() == expected.keys()
    for name in expected:
        assert torch.equal(final[name], expected[name]), name


def test_two_nodes_test_as_one_node(reference, toy_root, tmp_path):
    """dist_test.sh on two nodes scores the reference's final checkpoint as the reference's
    own validation at its last iteration did (the same data and evaluator, two processes
    of one node)."""
    codes, logs = _two_nodes(
        [
            'tools/dist_test.sh',
            CONFIG,
            str(reference / f'iter_{ITERS}.pth'),
            '1',
            '--work-dir',
            str(tmp_path / 'test'),
        ],
        toy_root,
        tmp_path,
    )
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert 'process rank 1 of world size 2' in logs[1]
    (metrics,) = (tmp_path / 'test').glob('*/*.json')
    tested = json.loads(metrics.read_text())
    (validated,) = [r for r in train_scalars(reference) if 'coco/bbox_mAP' in r]
    keys = [k for k in validated if k.startswith('coco/')]
    assert keys and {k: tested[k] for k in keys} == {k: validated[k] for k in keys}


def test_killed_node_stops_the_other(toy_root, tmp_path):
    """Node 1's agent killed (SIGKILL) mid-run: its process follows it, node 0 exits
    non-zero within 60 s, and ``last_checkpoint`` names a checkpoint that loads."""
    work = tmp_path / 'work'
    args = ['tools/dist_train.sh', CONFIG, '1', '--work-dir', str(work)]
    args += ['--cfg-options', 'train_cfg.max_iters=1000', 'train_cfg.val_interval=1000']
    port = _free_port()
    procs = [
        _start_node(rank, args, toy_root, port, tmp_path / f'node{rank}.log') for rank in (0, 1)
    ]
    try:
        deadline = time.time() + 600
        while not (work / 'last_checkpoint').exists() and time.time() < deadline:
            assert all(p.poll() is None for p in procs), (tmp_path / 'node0.log').read_text()[
                -3000:
            ]
            time.sleep(0.1)
        assert procs[0].poll() is None and procs[1].poll() is None, 'the job ended before the kill'
        workers = _children(procs[1].pid)
        assert workers, 'node 1 runs no process'
        procs[1].send_signal(signal.SIGKILL)
        killed = time.time()
        code = procs[0].wait(timeout=120)
        waited = time.time() - killed
        procs[1].wait()
    finally:
        _kill(procs)
    assert code != 0 and waited < 60, (code, waited)
    time.sleep(1)
    assert all(_gone(pid) for pid in workers), f'the process of the killed node runs on: {workers}'
    target = (work / 'last_checkpoint').read_text().strip()
    checkpoint = torch.load(target, map_location='cpu', weights_only=True)
    assert checkpoint['meta']['iter'] >= 2 and checkpoint['state_dict']


def test_restart_resumes_to_the_uninterrupted_weights(reference, toy_root, tmp_path):
    """``MAX_RESTARTS=1`` and ``--resume`` on two nodes: the first start (empty work dir)
    trains from scratch, rank 1 is killed (SIGKILL) after iteration 3, torchrun restarts
    both nodes' processes, which resume from ``iter_2.pth`` and train iterations 3 and 4.
    The final weights are the reference's to float32 rounding (rtol 1e-6, a few ulps): the
    restarted processes run the same seeded operations in the same order (the data loader
    replays the samples it skips, the model draws no random numbers, the optimizer's state
    comes from the checkpoint), so only rounding could differ, while a resume one step off
    moves the weights by about the learning rate (5e-4)."""
    marker = tmp_path / 'killed'
    cfg = tmp_path / 'kill_rank.py'
    cfg.write_text(
        f"_base_ = '{CONFIG}'\n"
        "custom_imports = dict(imports=['mmcirc', 'kill_rank_hook'], allow_failed_imports=False)\n"
        f"custom_hooks = [dict(type='KillRankHook', rank=1, after_iter=3, marker='{marker}')]\n"
    )
    work = tmp_path / 'work'
    codes, logs = _two_nodes(
        ['tools/dist_train.sh', str(cfg), '1', '--work-dir', str(work), '--resume'],
        toy_root,
        tmp_path,
        env={
            'MAX_RESTARTS': '1',
            'PYTHONPATH': os.pathsep.join([HOOKS_DIR, os.environ.get('PYTHONPATH', '')]),
        },
    )
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert marker.exists(), 'rank 1 was never killed'
    assert len(run_dirs(work)) == 2, 'the job was not restarted once'
    first, resumed = _losses(work, 0), _losses(work, 1)
    expected = _losses(reference)
    assert {i: first[i] for i in (1, 2)} == {i: expected[i] for i in (1, 2)}
    assert 'resumed epoch: 0, iter: 2' in logs[0] + logs[1]
    assert resumed == {i: expected[i] for i in (3, 4)}
    final, reference_final = (
        _weights(work / f'iter_{ITERS}.pth'),
        _weights(reference / f'iter_{ITERS}.pth'),
    )
    assert final.keys() == reference_final.keys()
    for name in reference_final:
        torch.testing.assert_close(final[name], reference_final[name], rtol=1e-6, atol=0, msg=name)
