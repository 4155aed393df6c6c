"""The metafiles and the model zoo's counts they are written from: every config's
parameters and FLOPs, counted by ``tools/analysis/get_flops.py`` into one results file
(``docs/results/model_zoo.json``), and what is made from that file alone: the per-task
tables of ``configs/README.md`` (mmdet's "Results and models" form), one
``metafile.yml`` per model family and the ``model-index.yml`` that imports them
(OpenMMLab's format, read by ``mim search``).
``python .dev_scripts/benchmark_docs.py --tables zoo`` counts and writes them all;
``--no-run`` writes them from the file as it is.

* :func:`describe`: what a config is (family, backbone, task, dataset, schedule), from
  its name and its loaded config;
* :func:`render_zoo`: the tables; :func:`render_metafiles`: {path: text} of the metafiles
  and the model index, :func:`write_metafiles` writes them; :func:`count_zoo`: the
  results file, counted.
"""

import datetime
import json
import os
import os.path as osp
import re
import subprocess
import sys
import tempfile
from typing import Dict

from mmcirc.utils.fileio import atomic_write

from mmcirc.benchmark.report import markdown_table

__all__ = [
    'FAMILIES',
    'ZOO_COMMAND',
    'ZOO_RESULTS',
    'count_zoo',
    'describe',
    'render_metafiles',
    'render_zoo',
    'write_metafiles',
]

ZOO_RESULTS = 'docs/results/model_zoo.json'
#: the count of every config, as the results file records it (CONFIG: each config)
ZOO_COMMAND = 'python tools/analysis/get_flops.py CONFIG --mode backbone --shape 224 224'

CIRCULANT = dict(
    Title='Vision Transformers are Circulant Attention Learners',
    URL='https://arxiv.org/abs/2512.21542',
)
CORE = dict(
    Title='Elastic Attention Cores for Scalable Vision Transformers',
    URL='https://arxiv.org/abs/2605.12491',
)
#: config name prefix -> (collection, architecture, paper)
FAMILIES = {
    'ca_pvt': ('CA-PVT', ('Circulant Attention', 'PVT'), CIRCULANT),
    'core_pvt': ('Core-PVT', ('Core Attention', 'PVT'), CORE),
    'ca_swin': ('CA-Swin', ('Circulant Attention', 'Swin Transformer'), CIRCULANT),
    'core_swin': ('Core-Swin', ('Core Attention', 'Swin Transformer'), CORE),
    'ca_deit': ('CA-DeiT', ('Circulant Attention', 'DeiT'), CIRCULANT),
    'veca': ('VECA', ('Core Attention', 'ViT'), CORE),
}
TASKS = {  # default_scope -> (task, dataset, metrics)
    'mmdet': ('Object Detection', 'COCO', ('box AP', 'mask AP')),
    'mmseg': ('Semantic Segmentation', 'ADE20K', ('mIoU',)),
    'mmpretrain': ('Image Classification', 'ImageNet-1k', ('Top 1 Accuracy',)),
}
HEADS = {
    'retinanet': 'RetinaNet',
    'mask-rcnn': 'Mask R-CNN',
    'upernet': 'UperNet',
    'fpn': 'Semantic FPN',
    'linear': 'linear probe (frozen backbone)',
    'in1k': 'classifier',
}
LETTERS = {'t': 'T', 's': 'S', 'm': 'M', 'l': 'L', 'b': 'B'}
LAYOUTS = {'allcirc': 'circulant in every stage', 'allcore': 'core in every stage'}


def family_of(name: str) -> str:
    return next(f for f in sorted(FAMILIES, key=len, reverse=True) if name.startswith(f + '_'))


def describe(name: str, cfg) -> dict:
    """Family, backbone label, model, task and schedule of the config ``name``
    (``ca_pvt_s_retinanet_coco.py``) loaded as ``cfg``."""
    family = family_of(name)
    stem = name[: -len('.py')]
    parts = stem[len(family) + 1 :].split('_')  # e.g. ['s', 'retinanet', 'coco']
    size, layout = (parts[0].split('-') + [''])[:2]
    backbone = f'{FAMILIES[family][0]}-{LETTERS[size]}'
    if layout:
        backbone += f' ({LAYOUTS[layout]})'
    head = next(HEADS[p] for p in parts[1:] if p in HEADS)
    train = cfg.get('train_cfg') or {}
    epochs = train.get('max_epochs')
    if epochs and cfg.default_scope == 'mmdet' and epochs % 12 == 0:
        schedule = f'{epochs // 12}x'  # mmdet's name of its 12-epoch schedules
    elif epochs:
        schedule = f'{epochs} epochs'
    elif train.get('max_iters'):
        schedule = f'{train["max_iters"] // 1000}k iterations'
    else:
        schedule = '-'
    return dict(
        family=family,
        backbone=backbone,
        model=head,
        scope=cfg.default_scope,
        schedule=schedule,
    )


# ----------------------------------------------------------------------------- the tables


def _m(n: int) -> str:
    return f'{n / 1e6:.2f}'


def _g(n: int) -> str:
    return f'{n / 1e9:.2f}'


def render_zoo(store: dict) -> str:
    """One table per task: backbone, model, schedule, params, FLOPs, the result ("not
    trained" where no accuracy exists), the config, the download."""
    configs = store['configs']
    out = []
    for scope, (task, dataset, metrics) in TASKS.items():
        names = sorted(n for n, c in configs.items() if c['scope'] == scope)
        rows = [
            [
                configs[n]['backbone'],
                configs[n]['model'],
                configs[n]['schedule'],
                _m(configs[n]['params']),
                _g(configs[n]['flops']),
                *['not trained'] * len(metrics),
                f'[config]({n})',
                '-',
            ]
            for n in names
        ]
        head = ['backbone', 'model', 'schedule', 'params (M)', 'GMACs']
        head += [*metrics, 'config', 'download']
        align = 'lllrr' + 'l' * len(metrics) + 'll'
        out.append(f'**{dataset}** ({task.lower()})\n\n' + markdown_table(head, rows, align))
    env = store['environment']
    return (
        '\n\n'.join(out)
        + f'\n\nParams: the whole model as its config builds it (detector, segmentor or '
        'classifier, heads included). GMACs: multiply-adds of `extract_feat` (the backbone, '
        'and the neck where the model has one) at 224 x 224, with the FFTs, softmax and SDPA '
        f'counted. Both from `{store["command"]}` for every config, {env["date"]}, torch '
        f'{env["torch"]}, mmcv {env["mmcv"]}; results file: `{ZOO_RESULTS}`.'
    )


# ----------------------------------------------------------------------------- metafiles


def _q(text: str) -> str:
    """A YAML scalar: quoted when it holds a character YAML reads as syntax."""
    return f"'{text}'" if re.search(r'[:#\[\]{}&*!|>\'"%@`,]', text) else text


def render_metafiles(store: dict) -> Dict[str, str]:
    """{path relative to the repository root: text}: ``configs/<family>/metafile.yml``
    for every family with a config, and ``model-index.yml``."""
    configs = store['configs']
    files = {}
    for family, (collection, arch, paper) in FAMILIES.items():
        names = sorted(n for n, c in configs.items() if c['family'] == family)
        if not names:
            continue
        lines = [
            f'# {collection}: no trained weights exist, so no model has Results or Weights.',
            '# FLOPs: multiply-adds of extract_feat at 224 x 224 (GMACs in configs/README.md).',
            f'# Written by `python .dev_scripts/benchmark_docs.py --tables zoo` from {ZOO_RESULTS}.',
            'Collections:',
            f'  - Name: {collection}',
            '    Metadata:',
            '      Architecture:',
            *[f'        - {a}' for a in arch],
            '    Paper:',
            f'      Title: {_q(paper["Title"])}',
            f'      URL: {paper["URL"]}',
            '    README: configs/README.md',
            '',
            'Models:',
        ]
        for n in names:
            c = configs[n]
            task, dataset, _ = TASKS[c['scope']]
            lines += [
                f'  - Name: {n[: -len(".py")]}',
                f'    In Collection: {collection}',
                f'    Config: configs/{n}',
                '    Metadata:',
                f'      Parameters: {c["params"]}',
                f'      FLOPs: {c["flops"]}',
                f'      Training Data: {dataset}',
                f'    Results: []  # {task}, {dataset}: not trained',
            ]
        files[osp.join('configs', family, 'metafile.yml')] = '\n'.join(lines) + '\n'
    index = ['Import:'] + [f'  - {p}' for p in sorted(files)]
    files['model-index.yml'] = '\n'.join(index) + '\n'
    return files


def write_metafiles(root: str) -> None:
    """Write :func:`render_metafiles` of ``root/``:data:`ZOO_RESULTS` under ``root``."""
    with open(osp.join(root, ZOO_RESULTS)) as f:
        files = render_metafiles(json.load(f))
    for rel, text in files.items():
        atomic_write(osp.join(root, rel), text)
    print(f'[docs] wrote the metafiles and model-index.yml under {root}')


def count_zoo(root: str) -> None:
    """:data:`ZOO_COMMAND` (``tools/analysis/get_flops.py``, run as a user runs it) on every
    config under ``root/configs`` (``toy/`` aside), into ``root/``:data:`ZOO_RESULTS`."""
    import mmcv
    import torch
    from mmengine.config import Config

    import mmcirc

    names = sorted(n for n in os.listdir(osp.join(root, 'configs')) if n.endswith('.py'))
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [osp.dirname(osp.dirname(mmcirc.__file__)), env.get('PYTHONPATH', '')]
    )
    configs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = osp.join(root, 'configs', name)
            out = osp.join(tmp, name + '.json')
            argv = ZOO_COMMAND.split()[1:]
            argv[0] = osp.join(root, argv[0])
            argv[argv.index('CONFIG')] = path
            print(f'[docs] zoo: get_flops.py {name}', flush=True)
            proc = subprocess.run([sys.executable, *argv, '--out-json', out], env=env)
            if proc.returncode:
                raise ValueError(f'get_flops.py {name}: exit status {proc.returncode}')
            with open(out) as f:
                counted = json.load(f)
            configs[name] = dict(
                describe(name, Config.fromfile(path)),
                params=int(counted['params']),
                flops=int(counted['flops']),
                mode=counted['mode'],
            )
    store = dict(
        command=ZOO_COMMAND,
        environment=dict(
            date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d'),
            torch=torch.__version__,
            mmcv=mmcv.__version__,
        ),
        configs=configs,
    )
    text = json.dumps(store, indent=1, sort_keys=True)
    atomic_write(osp.join(root, ZOO_RESULTS), text + '\n')
