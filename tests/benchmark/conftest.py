"""The documentation's generators are repository upkeep in .dev_scripts/ (not in the
package): their tests import them from there. The suite runs that several tests read,
each test one side of the same output: :func:`layer_run`, :func:`backbone_run`."""

import os.path as osp
import shutil
import sys

import pytest
import torch

from helpers import REPO

sys.path.insert(0, osp.join(REPO, '.dev_scripts'))
DOCS_FIXTURES = osp.join(REPO, 'tests', 'fixtures', 'docs')


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """A suite that measures in this process (``--in-process``, ``launches``) pins torch's
    threads: restored after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='session')
def layer_run(tmp_path_factory):
    """``python -m mmcirc.benchmark layer --methods sdpa circ-circ --sizes 8 --repeat 2
    --threads 1 --no-backward`` (the command's main in this process, the layers measured in
    their children: one memory child each, one timing child): its out-dir."""
    from mmcirc.benchmark.command import main

    out = tmp_path_factory.mktemp('layer')
    args = ['--sizes', '8', '--repeat', '2', '--threads', '1', '--no-backward']
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('OMP_NUM_THREADS', '1')
        main(['layer', *args, '--methods', 'sdpa', 'circ-circ', '--out-dir', str(out)])
    return out


@pytest.fixture(scope='session')
def backbone_run(tmp_path_factory):
    """``python .dev_scripts/benchmark_docs.py --doc benchmarks.md --headline README.md
    --tables backbones --out-dir out --sizes 64 --models pvt_s circ_pvt_s`` (in this
    process; the ``model`` suite measures in its children) in a folder holding copies of
    the docs fixtures: that folder (``out/backbones``: the suite's store and table)."""
    import benchmark_docs

    root = tmp_path_factory.mktemp('backbones')
    for name in ('benchmarks.md', 'README.md'):
        shutil.copy(osp.join(DOCS_FIXTURES, name), root / name)
    args = ['--doc', 'benchmarks.md', '--headline', 'README.md', '--tables', 'backbones']
    args += ['--out-dir', 'out', '--sizes', '64', '--models', 'pvt_s', 'circ_pvt_s']
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv('OMP_NUM_THREADS', '1')
        benchmark_docs.main(args)
    return root
