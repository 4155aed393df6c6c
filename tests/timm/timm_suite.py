"""timm's own model tests (``tests/test_models.py`` of the installed timm's sdist) with
mmcirc's models in timm's lists: :func:`collect` gives the tests that
``test_timm_contract.py`` runs.

The set-up (``tools/setup_env.sh``) fetches the sdist's ``tests/`` once into
``${MMCIRC_CACHE}/timm-tests/timm-<version>/``; without it collection fails and says so.

timm's file parametrizes its tests by walking the registry at import time
(``list_models``, with its lists of families). It is imported here with the walk placing
mmcirc's models where timm lists their families, and yielding only those:

* ``FEAT_INTER_FILTERS`` (the modules with ``forward_intermediates``, ``pvt_v2``,
  ``swin_transformer``, ``deit``, ``vision_transformer`` among them): all the models
  (module ``zoo``);
* ``NON_STD_FILTERS`` (``deit*``, ``vit_*``: transformers whose features are tokens):
  CA-DeiT and VECA; the pyramids take the standard (NCHW) tests.

Every test whose parametrization then holds mmcirc's models runs on them: the config
and interface tests (on the meta device) on all 16 registered models, the tests that
run models on one model per family, its small variant (the registry walk's choice of
that family's model, built with :data:`VARIANTS`'s sizes). timm's tests that name
their models (the generic contracts timm checks on a few families: pooling
kept by ``reset_classifier``, ``head_hidden_size``, pruning, the feature class, meta
device then ``init_weights``) run on one model per mmcirc family, where the contract
applies to it. timm's tests of its own layers and models are not imported.
"""

import contextlib
import functools
import importlib.util
import os
import os.path as osp

import pytest
import timm
from timm_variants import SMALL

import mmcirc.timm

#: where timm lists mmcirc's families (see the module docstring)
FEATURE_MODULE = mmcirc.timm.zoo.__name__.rsplit('.', 1)[-1]  # 'zoo'
NON_STD = ('ca_deit_*', 'veca_*')
MODELS = frozenset(mmcirc.timm.MODEL_NAMES)

#: one model per family, small (tests/timm/timm_variants.py)
PYRAMIDS = ('ca_pvt_tiny', 'core_pvt_tiny', 'ca_swin_tiny', 'core_swin_tiny')
ISOTROPIC = ('ca_deit_tiny', 'veca_small')

FAMILIES = PYRAMIDS + ISOTROPIC
#: the small variants, with three blocks at least in the isotropic models (timm's tests
#: want three feature levels)
VARIANTS = dict(
    SMALL,
    ca_deit_tiny=dict(SMALL['ca_deit_tiny'], arch=dict(SMALL['ca_deit_tiny']['arch'], depth=3)),
    veca_small=dict(SMALL['veca_small'], arch=dict(SMALL['veca_small']['arch'], num_layers=3)),
)
#: the registry walks run on every registered model (structure and shapes, on the meta
#: device); the others on one model per family, its small variant (the variants of a
#: family differ in widths and depths only)
ALL_MODELS = ('test_model_default_cfgs', 'test_model_default_cfgs_non_std')

#: timm's tests naming their models whose contract applies to mmcirc's: the families it
#: runs on (those taking ``model_kwargs`` get the small variants).
BY_FAMILY = {
    'test_reset_classifier_keeps_pool': PYRAMIDS,  # NCHW pooling ('max', 'avg')
    'test_head_hidden_size': PYRAMIDS + ISOTROPIC,
    'test_catavgmax_unsupported': ISOTROPIC,  # the pyramids take concat pooling
    'test_prune_intermediate_layers_params_used': PYRAMIDS + ISOTROPIC,
    'test_forward_after_prune_intermediate_layers': PYRAMIDS + ISOTROPIC,
    'test_prune_intermediate_layers_last_feature': PYRAMIDS,  # NCHW features
    'test_prune_to_stem_feature': PYRAMIDS,
    'test_forward_intermediates_stop_early_final_norm': PYRAMIDS,  # ViTs norm every tap
    'test_features_only_feature_cls_class': PYRAMIDS + ISOTROPIC,
    'test_model_init_weights_after_to_empty': PYRAMIDS + ISOTROPIC,
    'test_features_only_grad_checkpointing_backward': PYRAMIDS + ISOTROPIC,
}


def cache_dir() -> str:
    """``${MMCIRC_CACHE}``, as tools/setup_env.sh resolves it."""
    xdg = os.environ.get('XDG_CACHE_HOME') or osp.join(osp.expanduser('~'), '.cache')
    return os.environ.get('MMCIRC_CACHE') or osp.join(xdg, 'mmcirc')


def timm_tests_file() -> str:
    """timm's ``tests/test_models.py`` of the installed version; RuntimeError if absent."""
    path = osp.join(
        cache_dir(), 'timm-tests', f'timm-{timm.__version__}', 'tests', 'test_models.py'
    )
    if not osp.isfile(path):
        raise RuntimeError(
            f"timm {timm.__version__}'s own tests are not at {path}: run "
            'bash tools/setup_env.sh (it fetches them from the PyPI sdist once)'
        )
    return path


def _names(patterns) -> list:
    return [patterns] if isinstance(patterns, str) else list(patterns)


def _placed(list_models):
    """timm's ``list_models`` walking the registry with mmcirc's families in timm's lists,
    yielding mmcirc's models only."""

    def walk(filter='', module='', pretrained=False, exclude_filters='', **kwargs):
        if 'deit' in _names(module):
            module = _names(module) + [FEATURE_MODULE]
        if 'deit*' in _names(filter):
            filter = _names(filter) + list(NON_STD)
        if 'deit*' in _names(exclude_filters):
            exclude_filters = _names(exclude_filters) + list(NON_STD)
        names = list_models(filter, module, pretrained, exclude_filters, **kwargs)
        return [n for n in names if n.split('.')[0] in MODELS]

    return walk


def _load(path: str):
    spec = importlib.util.spec_from_file_location('timm_test_models', path)
    module = importlib.util.module_from_spec(spec)
    real = timm.list_models
    timm.list_models = _placed(real)  # the file does ``from timm import list_models``
    try:
        spec.loader.exec_module(module)
    finally:
        timm.list_models = real
    return module


def _model_param(fn):
    """timm's parametrize mark over ``model_name`` of ``fn`` (None if it has none)."""
    for mark in getattr(fn, 'pytestmark', []):
        if mark.name == 'parametrize' and 'model_name' in mark.args[0]:
            return mark
    return None


def _first(value):
    return value[0] if isinstance(value, tuple) else value


@contextlib.contextmanager
def _small_variants(namespace: dict):
    """timm's ``create_model`` in the test file's ``namespace`` building the small
    variant of a family's model (:data:`VARIANTS`; the caller's keyword arguments on
    top)."""
    create = namespace['create_model']

    def small(model_name, *args, **kwargs):
        return create(
            model_name, *args, **dict(VARIANTS.get(model_name.split('.')[0], {}), **kwargs)
        )

    namespace['create_model'] = small
    try:
        yield
    finally:
        namespace['create_model'] = create


def _remarked(fn, mark, values):
    """``fn`` with its parametrization ``mark`` over ``values`` instead, on the small
    variants of the models."""

    @functools.wraps(fn)
    def test(*args, **kwargs):
        with _small_variants(fn.__globals__):
            return fn(*args, **kwargs)

    test.pytestmark = [m for m in fn.pytestmark if m is not mark] + [
        pytest.mark.parametrize(mark.args[0], values).mark
    ]
    return test


def _on_families(fn, mark, names):
    """``fn`` parametrized over ``names`` instead of timm's models (the other values of
    its parametrization, e.g. ``stop_early_final``, taken from timm's first case)."""
    argnames = (
        [a.strip() for a in mark.args[0].split(',')]
        if isinstance(mark.args[0], str)
        else list(mark.args[0])
    )
    first = mark.args[1][0]
    values = []
    for name in names:
        case = dict(zip(argnames, first if len(argnames) > 1 else (first,)))
        case['model_name'] = name
        if 'model_kwargs' in case:
            case['model_kwargs'] = dict(VARIANTS[name])
        if 'kwargs' in case:
            case['kwargs'] = dict(VARIANTS[name])
        values.append(tuple(case[a] for a in argnames) if len(argnames) > 1 else name)
    return _remarked(fn, mark, values)


def collect() -> dict:
    """name -> test function (and timm's fixtures) to put in a test module's namespace."""
    module = _load(timm_tests_file())
    out = {}
    for name, obj in vars(module).items():
        mark = _model_param(obj) if name.startswith('test_') and callable(obj) else None
        if mark is None:
            continue
        ours = [v for v in mark.args[1] if _first(v).split('.')[0] in MODELS]
        if ours and name in ALL_MODELS:
            out[name] = obj  # a registry walk: mmcirc's models placed in timm's lists
        elif ours:
            out[name] = _remarked(obj, mark, [v for v in ours if _first(v) in FAMILIES])
        elif name in BY_FAMILY:
            out[name] = _on_families(obj, mark, BY_FAMILY[name])
    missing = sorted(set(BY_FAMILY) - set(out))
    if missing:
        raise RuntimeError(f"timm's {module.__file__} has no tests {missing}")
    out['cfg_device'] = module.cfg_device  # the fixture of timm's cfg tests
    return out
