"""tools/mmcv_build.sh, the functions tools/setup_env.sh and tools/deployment/gpu_checks.sh
use to pick the CUDA toolkit and architectures and to patch mmcv 2.1.0's sources. Each
test sources the library in bash; fake nvcc scripts stand in for CUDA toolkits."""

import os
import os.path as osp
import subprocess
import sys
import tarfile

import pytest

from helpers import REPO

LIB = osp.join(REPO, 'tools', 'mmcv_build.sh')


def bash(script, env=None, check=True):
    """Run ``script`` after sourcing the library; ``fail`` and ``say`` as the callers
    define them. Returns (exit status, stdout, stderr)."""
    prelude = (
        'say() { echo "say: $*"; }\n'
        'fail() { echo "error: $1 (try: $2)" >&2; exit 1; }\n'
        f'. {LIB}\n'
    )
    proc = subprocess.run(
        ['bash', '-c', prelude + script],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.returncode, proc.stdout.strip(), proc.stderr.strip()


def fake_toolkit(root, release):
    """A CUDA_HOME whose bin/nvcc reports ``release`` and its TOP like the real one."""
    os.makedirs(root / 'bin')
    os.makedirs(root / 'include')
    nvcc = root / 'bin' / 'nvcc'
    nvcc.write_text(
        '#!/bin/sh\n'
        f'case "$*" in *-dryrun*) echo "#\\$ TOP={root}/bin/.." >&2 ;;\n'
        f'  *) echo "Cuda compilation tools, release {release}, V{release}.1" ;; esac\n'
    )
    nvcc.chmod(0o755)
    return root


@pytest.mark.parametrize(
    'arch, key', [('9.0', 'sm90'), ('8.6;9.0', 'sm86_90'), ('8.0 8.6 9.0+PTX', 'sm80_86_90ptx')]
)
def test_arch_key_names_the_arch_list(arch, key):
    assert bash(f'mmcv_arch_key "{arch}"')[1] == key


def test_arch_list_is_the_callers_else_9_0_without_a_gpu():
    py = sys.executable
    env = {'CUDA_VISIBLE_DEVICES': ''}  # no GPU visible, also on a GPU machine
    assert bash(f'unset TORCH_CUDA_ARCH_LIST; mmcv_cuda_arch {py}', env)[1] == '9.0'
    env['TORCH_CUDA_ARCH_LIST'] = '8.0;9.0'
    assert bash(f'mmcv_cuda_arch {py}', env)[1] == '8.0;9.0'


def test_cuda_home_of_a_wrapper_nvcc_on_path_is_its_toolkit(tmp_path):
    toolkit = fake_toolkit(tmp_path / 'cuda-13.0', '13.0')
    wrappers = tmp_path / 'bin'  # like /usr/local/bin/nvcc -> exec /usr/local/cuda-13.0/bin/nvcc
    wrappers.mkdir()
    (wrappers / 'nvcc').write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    (wrappers / 'nvcc').chmod(0o755)
    env = {'PATH': f'{wrappers}:{os.environ["PATH"]}'}
    assert bash('unset CUDA_HOME; mmcv_find_cuda_home', env)[1] == str(toolkit)
    assert bash('mmcv_find_cuda_home', dict(env, CUDA_HOME='/opt/cu'))[1] == '/opt/cu'


def test_nvcc_of_another_cuda_version_is_one_error_line(tmp_path):
    toolkit = fake_toolkit(tmp_path / 'cuda-12.4', '12.4')
    assert bash(f'mmcv_check_nvcc python {toolkit} 12.4')[0] == 0
    rc, _, err = bash(f'mmcv_check_nvcc python {toolkit} 13.0', check=False)
    assert rc == 1 and err.count('\n') == 0
    assert 'CUDA mismatch: nvcc in' in err and 'is CUDA 12.4, torch was built with CUDA 13.0' in err
    rc, _, err = bash(f'mmcv_check_nvcc python {tmp_path} 13.0', check=False)
    assert rc == 1 and err.startswith(f'error: no nvcc at {tmp_path}/bin/nvcc')


def test_torch_wheel_headers_only_where_the_toolkit_lacks_them(tmp_path):
    py = sys.executable
    minimal = fake_toolkit(tmp_path / 'minimal', '13.0')
    _, dirs, _ = bash(f'mmcv_torch_cuda_includes {py} {minimal}')
    import torch

    if torch.version.cuda:  # a CUDA build of torch brings the nvidia-* wheels
        assert dirs and all(osp.isfile(osp.join(d, 'cusparse.h')) for d in dirs.split(':'))
    (minimal / 'include' / 'cusparse.h').write_text('')
    assert bash(f'mmcv_torch_cuda_includes {py} {minimal}')[1] == ''


def test_sources_get_the_cxx_standard_of_torch_once(tmp_path):
    setup = 'x = ["-std=c++17"]\ny = "-std=c++17"\n'
    src = tmp_path / 'mmcv-2.1.0'
    src.mkdir()
    (src / 'setup.py').write_text(setup)
    with tarfile.open(tmp_path / 'mmcv.tar.gz', 'w:gz') as tar:
        tar.add(src, arcname='mmcv-2.1.0')
    out = tmp_path / 'build'
    script = f'mmcv_patch_sources {sys.executable} {tmp_path}/mmcv.tar.gz {out} 1'
    import torch

    major, minor = (int(v) for v in torch.__version__.split('.')[:2])
    std = 'c++20' if (major, minor) >= (2, 10) else 'c++17'
    for _ in range(2):  # a resumed build re-applies the patch as a no-op
        assert (
            bash(script)[1]
            == f'say: compiling with -std={std} for torch {torch.__version__.split("+")[0]}'
        )
        assert (out / 'setup.py').read_text() == setup.replace('c++17', std)
