"""Helpers shared by the tests: paths of the repo, a runner for its tools, and one
recorded training step of a segmentor."""

import contextlib
import glob
import mmap
import os
import os.path as osp
import subprocess
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
FIXTURE_CONFIGS = osp.join(REPO, 'tests', 'fixtures', 'configs')


def run_tool(args, cwd, timeout=900, env=None, check=True):
    """Run ``args`` (a tools/ script and its arguments) with this Python in ``cwd``."""
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', PYTHON=sys.executable, **(env or {}))
    full_env['PYTHONPATH'] = REPO + os.pathsep + full_env.get('PYTHONPATH', '')
    if args[0].endswith('.py'):
        args = [sys.executable, osp.join(REPO, args[0]), *args[1:]]
    else:
        args = ['bash', osp.join(REPO, args[0]), *args[1:]]
    proc = subprocess.run(
        args, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f'{" ".join(args)} failed ({proc.returncode}):\n'
            f'{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}'
        )
    return proc


def touch_fresh_pages(nbytes):
    """Write ``nbytes`` of newly mapped anonymous memory, then unmap it: RSS grows by
    that much whatever the state of the heap. (A numpy or torch buffer may be served
    from freed memory that is still resident, which leaves RSS where it was.)"""
    block = mmap.mmap(-1, nbytes)
    page = b'\x01' * mmap.PAGESIZE
    for _ in range(nbytes // mmap.PAGESIZE):
        block.write(page)
    block.close()


#: What a torch-only machine (the lent GPU machine) lacks.
MM_LIBRARIES = ('mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain')

# A fresh interpreter like that machine, set up before any code runs by a
# ``sitecustomize`` module on PYTHONPATH: the OpenMMLab libraries cannot be imported (None
# in sys.modules: ImportError, find_spec() is None) and the mmcirc install is gone (the
# editable install's finder is dropped); mmcirc comes from the repository on PYTHONPATH,
# as ``PYTHONPATH=.`` gives it there. At exit the last stdout line says where mmcirc came
# from and which OpenMMLab modules loaded (JSON).
_SITECUSTOMIZE = """
import atexit, importlib.util, json, sys
MM = {mm!r}
for name in MM:
    sys.modules[name] = None
sys.meta_path[:] = [f for f in sys.meta_path if not f.__module__.startswith('__editable__')]


@atexit.register
def _origin():
    loaded = sorted(n for n in sys.modules if n.split('.')[0] in MM and sys.modules[n] is not None)
    mmcirc = sys.modules.get('mmcirc')
    print(json.dumps(dict(mmcirc=getattr(mmcirc, '__file__', None), mm=loaded)), flush=True)
"""


def run_torch_only(script=None, code=None, args=(), cwd=REPO, timeout=600):
    """Run a tools/ ``script`` (with ``args``) or Python ``code`` (where ``REPO`` is
    defined) in a process without the OpenMMLab libraries and without the mmcirc install
    (see ``_SITECUSTOMIZE``)."""
    import tempfile

    if (script is None) == (code is None):
        raise ValueError('run_torch_only: give script or code')
    with tempfile.TemporaryDirectory() as site:
        with open(osp.join(site, 'sitecustomize.py'), 'w') as f:
            f.write(_SITECUSTOMIZE.format(mm=MM_LIBRARIES))
        if script:
            argv = [osp.join(REPO, script), *args]
        else:
            argv = ['-c', f'REPO = {REPO!r}\n' + code, *args]
        env = dict(os.environ, PYTHONPATH=site + os.pathsep + REPO, OMP_NUM_THREADS='1')
        return subprocess.run(
            [sys.executable, *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def torch_only_origin(proc):
    """The last stdout line of :func:`run_torch_only`: ``{'mmcirc': file, 'mm': [...]}``."""
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1])


def _json_rows(path):
    """The JSON objects of a file mmengine writes one per line."""
    import json

    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_dirs(work_dir):
    """The ``WORK_DIR/<timestamp>`` folders of the runs that used ``work_dir``, oldest first."""
    return sorted(
        p
        for p in glob.glob(osp.join(str(work_dir), '[0-9]' * 8 + '_' + '[0-9]' * 6))
        if osp.isdir(p)
    )


def evaluated_metrics(work_dir):
    """The metrics tools/test.py wrote: mmengine's ``WORK_DIR/<timestamp>/<timestamp>.json``
    (the one test run in ``work_dir``)."""
    (run,) = run_dirs(work_dir)
    (metrics,) = _json_rows(osp.join(run, osp.basename(run) + '.json'))
    return metrics


def train_scalars(work_dir, run=-1):
    """The rows of ``vis_data/scalars.json`` of one training run in ``work_dir`` (the
    newest by default): per-iteration losses with their ``iter``, validation metrics."""
    return _json_rows(osp.join(run_dirs(work_dir)[run], 'vis_data', 'scalars.json'))


def train_iters(work_dir, run=-1):
    """The iterations one training run logged a loss for (newest run by default)."""
    return [r['iter'] for r in train_scalars(work_dir, run) if 'loss' in r]


def assert_metric(metrics, key, high):
    """``metrics[key]`` is a finite number in [0, high] (1 for COCO mAP, 100 for mIoU and
    accuracy, which mmseg and mmpretrain report in percent)."""
    import math

    assert key in metrics, f'{key} not among the metrics {sorted(metrics)}'
    value = metrics[key]
    assert isinstance(value, (int, float)) and not isinstance(value, bool), (key, value)
    assert math.isfinite(value) and 0 <= value <= high, f'{key} = {value}, expected in [0, {high}]'


# configs/ca_deit_s_upernet_160k_ade20k.py and configs/veca_b_upernet_160k_ade20k.py
# (UperNet with mmseg's multi-level neck) with width 32, 2 blocks (VECA: a bank of 16
# cores, chunks of 8) and small heads.
TINY_ISOTROPIC = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, {arch}), out_indices=-1, init_cfg=None{extra}),
    neck=dict(in_channels=[32], out_channels=8, scales=[4, 2, 1, 0.5]),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8),
    auxiliary_head=dict(in_channels=8, channels=8))
"""
TINY_ISOTROPIC_ARCH = {
    'ca_deit_s_upernet_160k_ade20k.py': ('embed_dims=32, depth=2', ''),
    'veca_b_upernet_160k_ade20k.py': (
        'embed_dims=32, num_layers=2, num_heads=2, mlp_ratio=2.0, num_cores=16',
        ', num_cores=16',
    ),
}
CADEIT_UPERNET, VECA_UPERNET = TINY_ISOTROPIC_ARCH


def tiny_isotropic_config(tmp_path, base):
    """A thin config over configs/<base> (CA-DeiT or VECA UperNet) with a tiny model."""
    path = tmp_path / ('tiny_' + base)
    arch, extra = TINY_ISOTROPIC_ARCH[base]
    path.write_text(
        TINY_ISOTROPIC.format(base=osp.join(REPO, 'configs', base), arch=arch, extra=extra)
    )
    return str(path)


# configs/ca_pvt_t-allcirc_fpn_80k_ade20k.py (all-circulant CA-PVT-T + Semantic FPN) with
# widths 8-32, one block per stage, one head and small neck / head.
TINY_PYRAMID_FPN = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                            num_heads=[1, 1, 1, 1])),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8))
"""


def tiny_pyramid_config(tmp_path, base='ca_pvt_t-allcirc_fpn_80k_ade20k.py', name='tiny_allcirc'):
    """``tmp_path/<name>.py``: a thin config over configs/<base> (a pyramid + Semantic
    FPN) with a tiny model."""
    path = tmp_path / (name + '.py')
    path.write_text(TINY_PYRAMID_FPN.format(base=osp.join(REPO, 'configs', base)))
    return str(path)


class CastInputs:
    """A segmentor's data preprocessor's own forward, its inputs then in ``dtype`` (set
    as ``model.data_preprocessor.forward``; an instance, unlike a lambda, travels to
    other processes pickled)."""

    def __init__(self, pre, dtype):
        self.pre, self.dtype = pre, dtype

    def __call__(self, data, training=False):
        data = type(self.pre).forward(self.pre, data, training)
        return dict(data, inputs=data['inputs'].to(self.dtype))


def seg_batch(num, size, num_classes, ignored):
    """mmseg's training batch of ``num`` random uint8 images of ``size`` (H, W) with
    labels in [0, num_classes) and a fraction ``ignored`` of the pixels 255 (seed 0)."""
    import torch
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    g = torch.Generator().manual_seed(0)
    h, w = size = tuple(size)
    inputs, samples = [], []
    for _ in range(num):
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g))
        labels = torch.randint(0, num_classes, (1, h, w), generator=g)
        labels[:, torch.rand(h, w, generator=g) < ignored] = 255
        sample = SegDataSample(metainfo=dict(img_shape=size, ori_shape=size, pad_shape=size))
        sample.gt_sem_seg = PixelData(data=labels)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def sgd_step_record(model, train_step, data):
    """One SGD step (lr 0.1) by ``train_step(data, optim_wrapper)`` after
    ``torch.manual_seed(0)`` (drop path and dropout draw alike in every process):
    (log values, every parameter's gradient at the step, the state dict after it)."""
    import torch
    from mmengine.optim import OptimWrapper

    grads = {}
    names = {p: n for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def keep(optimizer, args, kwargs):
        grads.update({names[p]: p.grad.clone() for p in model.parameters() if p.grad is not None})

    opt.register_step_pre_hook(keep)
    torch.manual_seed(0)
    log = train_step(data, OptimWrapper(opt))
    after = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {k: float(v) for k, v in log.items()}, grads, after


@contextlib.contextmanager
def command_state_kept(cwd=None):
    """A block that runs a command's ``main`` in this process (in ``cwd``), with what the
    command changes for the process put back after it: the working directory, the
    environment (``LOCAL_RANK``), the warning filters, mmengine's checkpoint loader, local
    file backend and checkpoint-hook ``open`` (the configs' SafeCheckpointIOHook installs
    mmcirc's), and the named instances mmengine keeps per process (visualizer, logger,
    message hub, default scope: the next Runner would reuse a visualizer of the same
    name, writing to this run's folder)."""
    import warnings

    import pytest
    from mmengine.fileio import io as mmengine_io
    from mmengine.fileio.backends import backends, prefix_to_backends
    from mmengine.hooks import checkpoint_hook
    from mmengine.runner.checkpoint import CheckpointLoader

    environ = dict(os.environ)
    instances = {cls: set(cls._instance_dict) for cls in _manager_classes()}
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        if cwd is not None:
            mp.chdir(cwd)
        mp.setattr(CheckpointLoader, '_schemes', CheckpointLoader._schemes.copy())
        mp.setitem(backends, 'local', backends['local'])
        mp.setitem(prefix_to_backends, '', prefix_to_backends[''])
        mp.setattr(mmengine_io, 'backend_instances', dict(mmengine_io.backend_instances))
        mp.setattr(checkpoint_hook, 'open', open, raising=False)
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(environ)
            for cls in _manager_classes():
                for name in set(cls._instance_dict) - instances.get(cls, set()):
                    cls._instance_dict.pop(name, None)


def _manager_classes():
    """mmengine's ManagerMixin classes (each holds its own named instances)."""
    from mmengine.utils import ManagerMixin

    todo, found = [ManagerMixin], []
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return [cls for cls in found if '_instance_dict' in vars(cls)]
