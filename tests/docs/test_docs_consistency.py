"""The documentation holds one number per fact: every table with a results file in the
repository is what that file renders, a figure shown in two documents agrees, a fact
stated in prose is stated in one document, the usage line of ``tools/test.py`` is the
same everywhere, and every relative link reaches its file and heading (narration:
test_docs_narration.py)."""

import glob
import os.path as osp
import re

import pytest

import docs_stored
import docs_tables as docs
from helpers import REPO

#: every markdown page a user reads
PAGES = sorted(
    osp.relpath(p, REPO)
    for p in [osp.join(REPO, 'README.md'), osp.join(REPO, 'configs', 'README.md')]
    + glob.glob(osp.join(REPO, 'docs', '*.md'))
    + glob.glob(osp.join(REPO, 'configs', '*', 'README.md'))
)


def _read(rel):
    with open(osp.join(REPO, rel)) as f:
        return f.read()


def _outside_blocks(text):
    """``text`` without what lies between any generated table's markers."""
    return re.sub(r'<!-- generated: \S+ -->.*?<!-- end -->', '', text, flags=re.S)


def _between(text, name):
    start = text.index(docs.marker(name)) + len(docs.marker(name))
    return text[start : text.index(docs.END_MARKER, start)]


@pytest.mark.parametrize('rel', docs_stored.DOCUMENTS)
def test_every_stored_table_is_what_its_results_file_renders(rel):
    text = _read(rel)
    assert docs_stored.render_document(text, REPO, where=rel) == text, (
        f'{rel} differs from its results files: python .dev_scripts/benchmark_docs.py --tables '
        + ' '.join(docs_stored.held(text))
    )


@pytest.mark.parametrize('name', list(docs_stored.STORED))
def test_every_stored_table_is_shown(name):
    holders = [rel for rel in docs_stored.DOCUMENTS if name in docs_stored.held(_read(rel))]
    assert holders, f'no document shows the stored table {name!r}'


def _rows(block):
    """{first cell: cells} of the markdown table rows of ``block``."""
    rows = {}
    for line in block.splitlines():
        if line.startswith('| ') and not line.startswith('|---'):
            cells = [c.strip() for c in line.strip('| ').split(' | ')]
            rows[cells[0]] = cells
    return rows


def test_the_readme_cpu_headline_agrees_with_the_benchmarks_backbone_table():
    head = _rows(_between(_read('README.md'), docs.HEADLINE))
    full = _rows(_between(_read('docs/benchmarks.md'), 'backbones'))
    models = set(head) - {'model'}
    assert models and models == set(full) - {'model'}
    for model in models:
        h, f = head[model], full[model]
        assert float(h[1]) == pytest.approx(float(f[1]), abs=0.05), (model, 'params')
        times = [t.split(' (')[0] for t in h[3].split(' / ')]
        assert times == [f[3], f[6]], (model, 'time')


def test_the_main_job_figures_are_stated_in_their_results_file_only():
    store = docs_stored.load(osp.join(REPO, 'docs', 'results', 'toy_job.json'))
    figures = {
        value
        for run in store['runs']
        for job in store['jobs']
        for key, value in run[job].items()
        if key == store['jobs'][job]['metric']
    }
    for rel in PAGES:
        text = _outside_blocks(_read(rel))
        for figure in figures:
            for m in re.finditer(rf'(mAP|mIoU)[^|.\n]{{0,12}}\b{re.escape(figure)}\b', text):
                pytest.fail(f'{rel}: {m.group(0)!r} restates a figure of docs/results/toy_job.json')


#: facts stated in prose that have one home: (what, pattern, the one page that states it)
ONE_HOME = [
    ('the CPU-only mmcv build time', r'about 10 min', 'docs/faq.md'),
    ('the CUDA mmcv build time', r'\b71 min', 'docs/faq.md'),
    ('the units of the mmcv builds', r'\b136 (units|\()', 'docs/faq.md'),
]


@pytest.mark.parametrize('what, pattern, home', ONE_HOME, ids=[f[0] for f in ONE_HOME])
def test_a_fact_in_prose_is_stated_on_one_page(what, pattern, home):
    pages = [rel for rel in PAGES if re.search(pattern, _read(rel))]
    assert pages == [home], f'{what} is stated in {pages}, its page is {home}'


TEST_USAGE = re.compile(r'^python tools/test\.py CONFIG CHECKPOINT .*$', re.M)


def test_the_usage_line_of_tools_test_is_one_line_everywhere():
    found = {rel: TEST_USAGE.findall(_read(rel)) for rel in [*PAGES, 'tools/test.py']}
    lines = {line for found_lines in found.values() for line in found_lines}
    assert len(lines) == 1, found
    assert sum(len(v) for v in found.values()) >= 4  # README, get_started, training, the tool


def test_the_usage_line_of_tools_test_names_only_its_flags(capsys):
    from mmcirc.cli.test import parse_args

    with pytest.raises(SystemExit):
        parse_args(['--help'])
    help_text = capsys.readouterr().out
    (line,) = set(TEST_USAGE.findall(_read('README.md')))
    flags = re.findall(r'--[a-z-]+', line)
    assert flags and all(re.search(rf'{flag}\b', help_text) for flag in flags), flags


def _anchors(rel):
    """GitHub's anchors of the headings of ``rel``."""
    headings = re.findall(r'^#+ (.+)$', _read(rel), flags=re.M)
    return {re.sub(r'[^\w\- ]', '', h.strip().lower()).replace(' ', '-') for h in headings}


@pytest.mark.parametrize('rel', PAGES)
def test_every_relative_link_reaches_a_file_and_its_heading(rel):
    text = re.sub(r'```.*?```', '', _read(rel), flags=re.S)
    for target in re.findall(r'\]\(([^)\s]+)\)', text):
        if re.match(r'[a-z]+:', target):
            continue
        path, _, anchor = target.partition('#')
        dest = osp.normpath(osp.join(osp.dirname(rel), path)) if path else rel
        assert osp.exists(osp.join(REPO, dest)), f'{rel}: {target}: no {dest}'
        if anchor and dest.endswith('.md'):
            assert anchor in _anchors(dest), f'{rel}: {target}: no heading #{anchor} in {dest}'


#: a path of this repository's configs or tools as the pages write it: not one under
#: another package's folder (``$MMDET/tools/train.py``), not a placeholder (``TOOL.py``)
REPO_PATH = re.compile(
    r'(?<![\w/$.-])((?:configs|tools)/(?:[\w.-]+/)*(?![A-Z_]+\.)[\w.-]+\.(?:py|sh))\b'
)


@pytest.mark.parametrize('rel', PAGES)
def test_every_config_and_tool_a_page_names_exists(rel):
    named = set(REPO_PATH.findall(_read(rel)))
    missing = sorted(p for p in named if not osp.exists(osp.join(REPO, p)))
    assert not missing, f'{rel} names {missing}'
