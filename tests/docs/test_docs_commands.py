"""What the pages tell a new user to type works as written: every path pattern a page
names (``tools/model_converters/{pvt,swin}_to_mmcirc.py``, ``configs/*/metafile.yml``)
matches files, the mim block makes the toy data before it trains on it, and the
``--cfg-options`` of dataset_prepare.md move every path of a config's data (the top-level
``data_root`` alone moves none)."""

import glob
import os.path as osp
import re
import shlex

import pytest

from helpers import REPO
from test_docs_consistency import PAGES


def _read(rel):
    with open(osp.join(REPO, rel)) as f:
        return f.read()


def _bash_lines(rel):
    """The lines of the bash blocks of ``rel``, continuations joined, comments dropped."""
    blocks = re.findall(r'```bash\n(.*?)```', _read(rel), flags=re.S)
    text = '\n'.join(blocks).replace('\\\n', ' ')
    return [ln.split(' #')[0].strip() for ln in text.splitlines() if ln.strip()]


#: a path of this repository with a wildcard or a brace list, as the pages write it
PATTERN = re.compile(r'(?<![\w/$.-])((?:configs|tools)/[\w./{},*-]*[*{][\w./{},*-]*)')


def _expand(pattern):
    """``a/{x,y}_b.py`` -> ``['a/x_b.py', 'a/y_b.py']`` (one brace list at a time)."""
    m = re.search(r'\{([^{}]*)\}', pattern)
    if not m:
        return [pattern]
    return [
        p
        for alt in m.group(1).split(',')
        for p in _expand(pattern[: m.start()] + alt + pattern[m.end() :])
    ]


@pytest.mark.parametrize('rel', PAGES)
def test_every_path_pattern_a_page_names_matches_files(rel):
    missing = [
        (pattern, path)
        for pattern in set(PATTERN.findall(_read(rel)))
        for path in _expand(pattern.rstrip('.,'))
        if not glob.glob(osp.join(REPO, path))
    ]
    assert not missing, f'{rel} names files that do not exist: {missing}'


def test_a_path_pattern_of_no_file_is_found():
    assert _expand('tools/{a,b}/x_*.py') == ['tools/a/x_*.py', 'tools/b/x_*.py']
    assert PATTERN.findall('see `tools/analysis/benchmark_*.py` and ') == [
        'tools/analysis/benchmark_*.py'
    ]
    assert not glob.glob(osp.join(REPO, 'tools/analysis/benchmark_*.py'))


def test_the_mim_block_makes_the_toy_data_before_it_trains_on_it():
    lines = [ln for ln in _bash_lines('docs/get_started.md') if ln.startswith('mim ')]
    make = lines.index('mim run mmcirc make_toy_data coco')
    (train,) = [i for i, ln in enumerate(lines) if ln.startswith('mim train mmcirc configs/toy/')]
    assert make < train, lines


def _documented_options():
    """{key: value} of dataset_prepare.md's ``--cfg-options`` line (the COCO config's)."""
    (line,) = [ln for ln in _bash_lines('docs/dataset_prepare.md') if '--cfg-options' in ln]
    argv = shlex.split(line)
    config = argv[2]
    options = argv[argv.index('--cfg-options') + 1 :]
    return config, dict(item.split('=', 1) for item in options)


def _data_paths(cfg):
    """Every path of the config's data: the datasets' data_root, the evaluators' ann_file."""
    paths = {f'{s}_dataloader.dataset.data_root': cfg[f'{s}_dataloader'].dataset.data_root
             for s in ('train', 'val', 'test')}  # fmt: skip
    for s in ('val', 'test'):
        evaluator = cfg[f'{s}_evaluator']
        if isinstance(evaluator, dict) and 'ann_file' in evaluator:
            paths[f'{s}_evaluator.ann_file'] = evaluator.ann_file
    return paths


def test_the_documented_cfg_options_move_every_data_path_and_data_root_none():
    from mmcirc.apis.builder import load_model_config

    config, options = _documented_options()
    root = options['train_dataloader.dataset.data_root']
    moved = _data_paths(load_model_config(osp.join(REPO, config), options))
    assert len(moved) == 5 and all(p.startswith(root) for p in moved.values()), moved
    kept = _data_paths(load_model_config(osp.join(REPO, config), {'data_root': root}))
    assert not any(p.startswith(root) for p in kept.values()), kept
