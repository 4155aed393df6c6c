"""pyproject.toml: the wheel built from the tree declares what mmcirc needs (torch for the
core, extras ``mm``, ``timm``, ``deploy``, ``dev``) with requirements.txt's specifiers;
``pip install -e ".[mm]"`` into an environment that holds the OpenMMLab stack installs
nothing else (the declared ranges admit the stack); the wheel in an environment with
torch and timm alone creates CA-DeiT through ``mmcirc.timm`` and runs it.

No network: pip runs with ``--no-index`` and no configuration. An environment "holds"
packages through a view: a folder of links to some top-level entries of this test run's
site-packages, named in a ``.pth`` file of a fresh venv (``--without-pip``).
"""

import email
import importlib.metadata as metadata
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers import MM_LIBRARIES, REPO

SITE = sysconfig.get_paths()['purelib']
EXTRAS = {'mm', 'timm', 'deploy', 'dev'}
PIP_ENV = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK='1')
PIP_ENV.pop('PYTHONPATH', None)  # what the venvs see is their own and their view's


def _run(args, **kw):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=PIP_ENV, **kw)
    assert proc.returncode == 0, f'{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'
    return proc


#: What a source distribution of the tree holds (MANIFEST.in adds the folders and files
#: that setup.py copies into the wheel's mmcirc/.mim/).
SDIST_FILES = (
    'pyproject.toml',
    'setup.py',
    'MANIFEST.in',
    'README.md',
    'requirements.txt',
    'model-index.yml',
)
SDIST_DIRS = ('mmcirc', 'configs', 'tools')


@pytest.fixture(scope='module')
def source(tmp_path_factory):
    """A copy of what a source distribution of the tree holds (SDIST_FILES, SDIST_DIRS)."""
    src = tmp_path_factory.mktemp('src')
    for name in SDIST_FILES:
        shutil.copy(osp.join(REPO, name), src / name)
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
    for name in SDIST_DIRS:
        shutil.copytree(osp.join(REPO, name), src / name, ignore=ignore)
    return src


@pytest.fixture(scope='module')
def wheel(source, tmp_path_factory):
    out = tmp_path_factory.mktemp('dist')
    _run(
        [sys.executable, '-m', 'pip', 'wheel', '-q', '--no-index', '--no-deps']
        + ['--no-build-isolation', '-w', str(out), str(source)]
    )
    (path,) = out.glob('mmcirc-*.whl')
    return path


def _metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
        return email.message_from_bytes(z.read(name))


def _requirements_txt():
    out = {}
    with open(osp.join(REPO, 'requirements.txt')) as f:
        for line in f:
            line = line.split('#')[0].strip()
            if line:
                req = Requirement(line)
                out[canonicalize_name(req.name)] = req
    return out


def _declared(meta):
    """{extra or '': {name: Requirement}} of a wheel's Requires-Dist."""
    out = {}
    for line in meta.get_all('Requires-Dist'):
        req = Requirement(line)
        extra = next((e for e in EXTRAS if req.marker and req.marker.evaluate({'extra': e})), '')
        assert extra or req.marker is None, line
        out.setdefault(extra, {})[canonicalize_name(req.name)] = req
    return out


def test_wheel_declares_torch_as_the_core_and_the_four_extras(wheel):
    meta = _metadata(wheel)
    from mmcirc.version import __version__

    assert meta['Name'] == 'mmcirc' and meta['Version'] == __version__
    assert set(meta.get_all('Provides-Extra')) == EXTRAS
    declared = _declared(meta)
    assert set(declared['']) == {'torch'}
    assert {'mmengine', 'mmcv', 'mmdet', 'mmsegmentation', 'mmpretrain'} <= set(declared['mm'])
    assert set(declared['timm']) == {'timm'}
    assert set(declared['deploy']) == {'onnx', 'onnxscript', 'onnxruntime'}
    assert 'mmcirc' in declared['dev'] and set(declared['dev']['mmcirc'].extras) == {
        'mm',
        'timm',
        'deploy',
    }


def test_wheel_and_requirements_txt_name_the_same_packages_with_the_same_specifiers(wheel):
    pins = _requirements_txt()
    declared = {}
    for reqs in _declared(_metadata(wheel)).values():
        declared.update({n: r for n, r in reqs.items() if n != 'mmcirc'})
    assert set(declared) == set(pins)
    for name, req in declared.items():
        assert req.specifier == pins[name].specifier, (name, str(req), str(pins[name]))


def _top_level(dist):
    """The site-packages entries a distribution installed (packages, modules, its
    .dist-info), from its RECORD."""
    names = set()
    for f in dist.files or ():
        first = f.parts[0]
        if first not in ('..', '__pycache__') and not first.endswith('.pth'):
            names.add(first)
    return names


def _dists():
    dists = metadata.distributions(path=[SITE])
    return {canonicalize_name(d.metadata['Name']): d for d in dists if d.metadata['Name']}


def _closure(roots):
    """``roots`` and what they require, with the extras they are required with, as
    installed here."""
    dists, todo, seen = _dists(), [(r, ()) for r in roots], set()
    while todo:
        name, extras = todo.pop()
        name = canonicalize_name(name)
        if (name, extras) in seen or name not in dists:
            continue
        seen.add((name, extras))
        for line in dists[name].requires or ():
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({'extra': e}) for e in ('',) + extras):
                todo.append((req.name, tuple(sorted(req.extras))))
    return {name for name, _ in seen}


def _venv(tmp_path, entries):
    """A fresh venv whose .pth names a folder of links to ``entries`` of SITE; returns
    (its python, its own site-packages)."""
    venv, view = tmp_path / 'venv', tmp_path / 'view'
    _run([sys.executable, '-m', 'venv', '--without-pip', str(venv)])
    view.mkdir()
    for name in sorted(entries):
        os.symlink(osp.join(SITE, name), view / name)
    python = venv / 'bin' / 'python'
    own = _run([str(python), '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'])
    own = own.stdout.strip()
    with open(osp.join(own, 'view.pth'), 'w') as f:
        f.write(str(view) + '\n')
    return python, own


def test_editable_install_with_the_mm_extra_admits_the_installed_stack(source, tmp_path):
    dists = _dists()
    mine = _top_level(dists['mmcirc']) if 'mmcirc' in dists else set()
    entries = {e for e in os.listdir(SITE) if not e.endswith('.pth')} - mine
    entries = {e for e in entries if not e.startswith('__editable__')}
    python, own = _venv(tmp_path, entries)
    before = set(os.listdir(own))
    _run(
        [str(python), '-m', 'pip', 'install', '-q', '--no-index', '--no-build-isolation']
        + ['-e', f'{source}[mm]']
    )
    added = set(os.listdir(own)) - before - {'__pycache__'}
    assert added and all('mmcirc' in n for n in added), added  # nothing but mmcirc
    proc = _run(
        [str(python), '-c', 'import importlib.util as u; print(u.find_spec("mmcirc").origin)'],
        cwd=str(tmp_path),
    )
    assert proc.stdout.strip() == str(source / 'mmcirc' / '__init__.py')


CREATE = """
import importlib.util, torch, timm
import mmcirc, mmcirc.timm
print([m for m in {mm!r} if importlib.util.find_spec(m) is not None])
model = timm.create_model('ca_deit_tiny').eval()
with torch.no_grad():
    print(tuple(model(torch.randn(1, 3, 64, 96)).shape), mmcirc.__version__, mmcirc.__file__)
"""


def test_wheel_with_torch_and_timm_alone_creates_ca_deit(wheel, tmp_path):
    entries = set()
    dists = _dists()
    for name in _closure(['torch', 'timm', 'pip']):
        entries |= _top_level(dists[name])
    assert not {canonicalize_name(m) for m in MM_LIBRARIES} & _closure(['torch', 'timm'])
    python, own = _venv(tmp_path, entries)
    _run([str(python), '-m', 'pip', 'install', '-q', '--no-index', f'{wheel}[timm]'])
    proc = _run([str(python), '-c', CREATE.format(mm=MM_LIBRARIES)], cwd=str(tmp_path))
    visible, result = proc.stdout.strip().splitlines()[-2:]
    assert visible == '[]'  # no OpenMMLab package can be imported there
    from mmcirc.version import __version__

    shape, version, origin = result.rsplit(' ', 2)
    assert shape == '(1, 1000)' and version == __version__
    assert origin == osp.join(own, 'mmcirc', '__init__.py')


# ------------------------------------------------------------------ mim: mmcirc/.mim/
DEV_SCRIPTS = {'setup_env.sh', 'mmcv_build.sh', 'run_tests.sh'}  # a checkout's, not shipped


def _files(folder):
    """The files under ``folder`` of the repository, relative to the repository."""
    found = set()
    for root, dirs, names in os.walk(osp.join(REPO, folder)):
        dirs[:] = [d for d in dirs if d != '__pycache__']
        for name in names:
            if not name.endswith('.pyc'):
                found.add(osp.relpath(osp.join(root, name), REPO))
    return found


def test_wheel_carries_configs_tools_and_the_model_index_under_mim(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        index = z.read('mmcirc/.mim/model-index.yml')
    shipped = {n[len('mmcirc/.mim/') :] for n in names if n.startswith('mmcirc/.mim/')}
    tools = {p for p in _files('tools') if osp.basename(p) not in DEV_SCRIPTS}
    assert shipped == _files('configs') | tools | {'model-index.yml'}
    with open(osp.join(REPO, 'model-index.yml'), 'rb') as f:
        assert index == f.read()


def _model_names():
    """Every model name of model-index.yml (its metafiles), read with PyYAML."""
    import yaml

    with open(osp.join(REPO, 'model-index.yml')) as f:
        imports = yaml.safe_load(f)['Import']
    names = []
    for path in imports:
        with open(osp.join(REPO, path)) as f:
            names += [m['Name'] for m in yaml.safe_load(f)['Models']]
    return names


MIM = 'import sys; from mim.cli import cli; sys.exit(cli())'


@pytest.fixture(scope='module')
def installed(wheel, tmp_path_factory):
    """A venv that sees this environment's packages except mmcirc's own install, with
    the wheel installed (not editable); returns its python."""
    tmp = tmp_path_factory.mktemp('installed')
    dists = _dists()
    mine = _top_level(dists['mmcirc']) if 'mmcirc' in dists else set()
    entries = {e for e in os.listdir(SITE) if not e.endswith('.pth')} - mine
    entries = {e for e in entries if not e.startswith('__editable__')}
    python, _ = _venv(tmp, entries)
    _run([str(python), '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', str(wheel)])
    return python


def test_mim_search_lists_every_model_of_the_model_index(installed, tmp_path):
    out = _run([str(installed), '-c', MIM, 'search', 'mmcirc'], cwd=str(tmp_path)).stdout
    listed = set(re.findall(r'[\w.-]+', out))
    names = _model_names()
    assert len(names) > 40 and not [n for n in names if n not in listed]


def test_mim_search_model_and_field_select_a_collection_and_a_column(installed, tmp_path):
    args = ['search', 'mmcirc', '--model', 'ca-pvt', '--field', 'config']
    out = _run([str(installed), '-c', MIM, *args], cwd=str(tmp_path)).stdout
    import yaml

    with open(osp.join(REPO, 'configs', 'ca_pvt', 'metafile.yml')) as f:
        configs = sorted(m['Config'] for m in yaml.safe_load(f)['Models'])
    assert sorted(re.findall(r'^config\s+(\S+)$', out, re.M)) == configs


def test_mim_train_runs_the_installed_tools_on_the_installed_toy_config(
    installed, toy_root, tmp_path
):
    work = tmp_path / 'work'
    options = ['train_cfg.max_iters=2', 'train_cfg.val_interval=100']
    options += ['default_hooks.checkpoint.interval=2', 'train_dataloader.num_workers=0']
    options += ['train_dataloader.persistent_workers=False']
    proc = _run(
        [str(installed), '-c', MIM, 'train', 'mmcirc', 'configs/toy/ca_pvt_t_retinanet_toy.py']
        + ['--work-dir', str(work), '--cfg-options', *options],
        cwd=str(toy_root),
    )
    script = re.search(r'Training command is \S+ (\S+) (\S+)', proc.stdout)
    site = osp.dirname(osp.dirname(str(installed)))
    assert script.group(1).startswith(site) and script.group(1).endswith(
        'mmcirc/.mim/tools/train.py'
    )
    assert script.group(2).endswith('mmcirc/.mim/configs/toy/ca_pvt_t_retinanet_toy.py')
    import torch

    assert torch.load(work / 'iter_2.pth', weights_only=True)['meta']['iter'] == 2


def test_mim_run_make_toy_data_writes_the_toy_coco_data_where_it_runs(installed, tmp_path):
    """get_started.md's mim block makes the data its toy config reads."""
    _run([str(installed), '-c', MIM, 'run', 'mmcirc', 'make_toy_data', 'coco'], cwd=str(tmp_path))
    import json

    with open(tmp_path / 'data' / 'toy_coco' / 'annotations' / 'instances_val2017.json') as f:
        val = json.load(f)
    assert val['images'] and val['annotations']


def test_the_wheels_run_demo_trains_where_it_runs_without_a_checkout(installed, toy_root, tmp_path):
    """The wheel has no setup_env.sh: its run_demo.sh runs with the installed Python and
    writes work_dirs/ in the current folder. Stopped once training has started (the
    config's copy in the work dir)."""
    import signal
    import time

    where = 'import mmcirc, os.path as p; print(p.join(p.dirname(mmcirc.__file__), ".mim"))'
    mim = _run([str(installed), '-c', where], cwd=str(tmp_path)).stdout.strip()
    script = osp.join(mim, 'tools', 'run_demo.sh')
    assert not osp.exists(osp.join(mim, 'tools', 'setup_env.sh'))
    os.symlink(toy_root / 'data', tmp_path / 'data')
    env = dict(PIP_ENV, PYTHON=str(installed))
    proc = subprocess.Popen(
        ['bash', script, 'det'], cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    work = tmp_path / 'work_dirs' / 'demo_det'
    try:
        deadline = time.monotonic() + 300
        while not list(work.glob('*.py')) and proc.poll() is None:
            assert time.monotonic() < deadline, 'run_demo.sh started no training'
            time.sleep(1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert list(work.glob('*.py')) == [work / 'ca_pvt_t_retinanet_toy.py'], out[-3000:]
    assert 'setup_env' not in out and not (tmp_path / '.venv').exists(), out[-3000:]
