"""The documentation says what is: no sentence narrates a run or a change to the code
(the history is CHANGELOG.md's, which is not read here). Every page a user reads is
checked, generated tables included, against patterns of narration: the first person,
the past tense of "to be" and simple past verbs of runs, "was changed" and its kin, "now",
"no longer", "used to", "before the fix / its layout", "this machine", "not yet"; inline
code (error messages quoted as printed) is left out."""

import os.path as osp
import re

import pytest

from helpers import REPO
from test_docs_consistency import PAGES

#: (what, pattern): each a way a sentence narrates; matched case-insensitively on the
#: page with its lines joined (a phrase may break across lines)
PATTERNS = [
    ('the first person', r"\b(?:we|we're|we've|we'd|our|ours|ourselves)\b"),
    ('the past tense of "to be"', r"\b(?:was|were|wasn't|weren't)\b"),
    ('a past perfect', r'\bhad (?:been|run|measured|changed|replaced|shown)\b'),
    (
        'a simple past of a run',
        r'\b(?:ran|blew|rose|fell|broke|went|came|took|gave|showed|grew|began|wrote|saw|'
        r"did|didn't|tried)\b",
    ),
    (
        'a change told as done',
        r'\b(?:has|have) (?:\w+ )?(?:changed|been replaced|been removed|been renamed|'
        r'been moved|been fixed|been rewritten|been dropped|been reworked|been refactored)\b',
    ),
    ('"now"', r'\bnow\b'),
    ('"no longer" / "any more"', r'\bno longer\b|\bany ?more\b'),
    (
        '"used to" (what something did)',
        r'(?<!is )(?<!are )(?<!be )\bused to (?:be|have|work|fail|run|take|give|need|call|'
        r'live|sit|hold|read|write|load)\b',
    ),
    (
        'a time of the code (before / after a change)',
        r'\b(?:before|after|until|since) (?:the|its|this|that|a) (?:[\w-]+ ){0,2}'
        r'(?:change|fix|rewrite|refactor|commit|patch|release|update|layout)s?\b',
    ),
    ('"as of" a time of the code', r'\bas of (?:commit|version|today|now)\b'),
    (
        'a time of the work',
        r'\b(?:yet|so far|at first|at the time|these days|previously|formerly|'
        r'originally|since replaced|earlier (?:runs?|versions?|code|layouts?|commits?)|'
        r'later (?:versions?|commits?))\b',
    ),
    (
        "the writer's situation",
        r'\bthis (?:machine|session|host|week|morning|afternoon)\b|\bsessions?\b|\btoday\b|'
        r'\byesterday\b|\bissue #?\d+\b|\bengineers?\b',
    ),
]
NARRATION = [(what, re.compile(p, re.I)) for what, p in PATTERNS]


def narration(text):
    """[(what, the phrase)] of every narrating phrase in ``text`` (markdown)."""
    prose = re.sub(r'`[^`\n]*`', ' ', text).replace('\n', ' ')
    return [(what, m.group(0)) for what, rx in NARRATION for m in rx.finditer(prose)]


@pytest.mark.parametrize('rel', PAGES)
def test_no_sentence_narrates_a_run_or_a_change(rel):
    with open(osp.join(REPO, rel)) as f:
        found = narration(f.read())
    assert not found, f'{rel}: ' + '; '.join(f'{what}: {phrase!r}' for what, phrase in found)


#: sentences of earlier pages of this repository, each narrating a run or a change
NARRATING = [
    'The GPU figures are of the eager code before its CUDA layout (CHANGELOG), whose forward '
    'on the GPU was bound by kernel launches, not by GPU work',
    "GPU: NVIDIA H200, 2026-12-04; the eager forward of mmcirc's models before the CUDA layout.",
    'The CUDA layout of circulant attention on a GPU: the H200 ran the code before it;',
    'The GPU tables are rendered from results files in the repository, since this machine '
    'has no GPU and the main job is not a benchmark suite.',
    'The faster recipe blew up in all three seeds once its learning rate passed about 5e-4; '
    "the config's never rose above its starting loss.",
    'Measured on an NVIDIA H200, with a script since replaced by benchmark_gpu.py',
    'The command that now measures the same comparison is benchmark_gpu.py',
    'on the earlier layout the counts grew with the input',
    'blocks no longer carry attention_probes',
    'the full-size check has not run on a GPU yet',
    'We measured the attention layer on the H200.',
    'The loader was changed to read the released files.',
    'The converter used to write the keys of the classifier.',
]


@pytest.mark.parametrize('sentence', NARRATING)
def test_a_narrating_sentence_is_found(sentence):
    assert narration(sentence), sentence


#: sentences that say what is, with the words the patterns look for nearby
DESCRIBING = [
    'Each suite writes a JSON store of its results with its machine.',
    'SafeCheckpointIOHook switches it on before the Runner initialises the weights.',
    'The converter reports what is loaded, what is left new and what of the source is unused.',
    'No ImageNet, COCO or ADE20K training has run; mmcirc ships no trained weights.',
    'The CUDA layout has not been measured on a GPU.',
    '`A module that was compiled using NumPy 1.x cannot be run in NumPy 2`',
    'Machine: 2026-12-03 20:37 UTC, AMD EPYC (AVX2), 2 CPUs.',
    'The weights used to initialise the backbone are in work_dirs/pretrained/.',
    'A known limitation: an interrupted build resumes where it stops.',
]


@pytest.mark.parametrize('sentence', DESCRIBING)
def test_a_describing_sentence_passes(sentence):
    assert not narration(sentence), narration(sentence)


def test_every_page_a_user_reads_is_checked_and_the_changelog_is_not():
    assert {'README.md', 'configs/README.md', 'docs/benchmarks.md'} <= set(PAGES)
    assert not any('CHANGELOG' in rel for rel in PAGES)
