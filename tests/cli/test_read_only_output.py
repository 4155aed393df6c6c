"""An output folder the user cannot write in: one ``error:`` line (exit 1) naming the flag
and the folder before the work (a converter: at its write, naming the file), nothing
written. The commands run in a fresh process as a user without
write permission there: as root (which ignores modes) under ``setpriv`` as ``nobody``,
otherwise as this user in a folder of mode 0555."""

import os
import os.path as osp
import shutil
import subprocess
import sys
import tempfile

import checkpoint_fakes as fakes
import cv2
import numpy as np
import pytest
import torch
from helpers import REPO

TOY_SEG = osp.join(REPO, 'configs', 'toy', 'ca_pvt_t_fpn_toy_ade.py')
NOBODY = 65534


@pytest.fixture
def folders():
    """(a folder the command may read, the read-only folder in it); both removed after."""
    root = tempfile.mkdtemp(prefix='mmcirc-ro-')  # not under pytest's 0700 basetemp
    os.chmod(root, 0o755)
    read_only = osp.join(root, 'ro')
    os.mkdir(read_only, 0o755 if os.geteuid() == 0 else 0o555)
    os.chmod(read_only, 0o755 if os.geteuid() == 0 else 0o555)
    home = osp.join(root, 'home')  # HOME, matplotlib's and mmengine's caches
    os.mkdir(home)
    os.chmod(home, 0o777)
    yield root, read_only
    os.chmod(read_only, 0o755)
    shutil.rmtree(root)


def _run(args, root):
    as_user = []
    if os.geteuid() == 0:
        as_user = ['setpriv', f'--reuid={NOBODY}', f'--regid={NOBODY}', '--clear-groups']
    env = dict(
        os.environ,
        HOME=osp.join(root, 'home'),
        MPLCONFIGDIR=osp.join(root, 'home'),
        PYTHONDONTWRITEBYTECODE='1',
        PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
    )
    env.pop('MMCIRC_DEBUG', None)
    proc = subprocess.run(
        [*as_user, sys.executable, osp.join(REPO, args[0]), *args[1:]],
        check=False,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return proc.returncode, lines[-1] if lines else ''


def _image(root):
    path = osp.join(root, 'img.png')
    cv2.imwrite(path, np.full((40, 60, 3), 128, np.uint8))
    os.chmod(path, 0o644)
    return path


@pytest.mark.parametrize(
    'tool, flag',
    [
        ('tools/train.py', '--work-dir'),
        ('tools/infer_highres.py', '--out-dir'),
        ('tools/dataset_converters/make_toy_data.py', '--out'),
    ],
)
def test_a_read_only_output_folder_is_one_line(folders, tool, flag):
    root, read_only = folders
    out = osp.join(read_only, 'out')
    args = {
        'tools/train.py': [TOY_SEG, flag, out],
        'tools/infer_highres.py': [TOY_SEG, '--img', _image(root), flag, out],
        'tools/dataset_converters/make_toy_data.py': ['coco', flag, out],
    }[tool]
    code, line = _run([tool, *args], root)
    assert (code, line) == (
        1,
        f'error: {flag} {out}: cannot write in {read_only}: Permission denied',
    )
    assert os.listdir(read_only) == []


def test_a_converter_into_a_read_only_folder_is_one_line(folders):
    root, read_only = folders
    src = osp.join(root, 'pvt_fake.pth')
    torch.save(fakes.official_pvt(), src)
    os.chmod(src, 0o644)
    out = osp.join(read_only, 'ca_pvt.pth')
    tool = 'tools/model_converters/pvt_to_mmcirc.py'
    code, line = _run([tool, src, out, '--arch', repr(fakes.PVT_ARCH)], root)
    assert (code, line) == (1, f'error: cannot write {out}: Permission denied')
    assert os.listdir(read_only) == []
