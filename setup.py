"""What pyproject.toml cannot say: a wheel (``pip wheel .``, ``pip install .``) carries
``configs/``, ``tools/`` and ``model-index.yml`` under ``mmcirc/.mim/``, where OpenMMLab's
``mim`` (``mim search / train / test / run mmcirc``) looks for them, as the wheels of
mmdet, mmseg and mmpretrain ship theirs (the configs name their bases by relative paths,
so they load from there). The scripts that set up a development checkout
(``tools/setup_env.sh``, ``mmcv_build.sh``, ``run_tests.sh``) stay out. An editable install (``pip install -e .``) runs everything
from the checkout instead: ``python tools/train.py``, configs by their path.
"""

import os.path as osp
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = osp.dirname(osp.abspath(__file__))
MIM_FILES = ('configs', 'tools', 'model-index.yml')
LEFT_OUT = shutil.ignore_patterns(
    '__pycache__', '*.pyc', 'setup_env.sh', 'mmcv_build.sh', 'run_tests.sh'
)


class BuildPyWithMim(build_py):
    """setuptools' ``build_py`` plus the copy of :data:`MIM_FILES` into the build."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            return
        mim = osp.join(self.build_lib, 'mmcirc', '.mim')
        shutil.rmtree(mim, ignore_errors=True)
        for name in MIM_FILES:
            src, dst = osp.join(ROOT, name), osp.join(mim, name)
            if not osp.exists(src):
                raise FileNotFoundError(f'mmcirc packaging: {src} is missing')
            if osp.isdir(src):
                shutil.copytree(src, dst, ignore=LEFT_OUT)
            else:
                shutil.copyfile(src, dst)


setup(cmdclass={'build_py': BuildPyWithMim})
