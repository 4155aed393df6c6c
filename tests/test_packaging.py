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


@pytest.fixture(scope='module')
def source(tmp_path_factory):
    """What a source distribution of the tree holds: pyproject.toml, README.md, mmcirc/."""
    src = tmp_path_factory.mktemp('src')
    for name in ('pyproject.toml', 'README.md'):
        shutil.copy(osp.join(REPO, name), src / name)
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
    shutil.copytree(osp.join(REPO, 'mmcirc'), src / 'mmcirc', ignore=ignore)
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
