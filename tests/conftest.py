"""Shared fixtures: the generated toy datasets."""
import os.path as osp
import subprocess
import sys

import pytest

from helpers import REPO


@pytest.fixture(scope='session')
def toy_root(tmp_path_factory):
    """A folder holding data/toy_coco, data/toy_ade and data/toy_imagenet (small)."""
    root = tmp_path_factory.mktemp('toy')
    subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'dataset_converters', 'make_toy_data.py'),
         'all', '--out', str(root / 'data'), '--num-train', '24', '--num-val', '8'],
        check=True, capture_output=True)
    return root
