"""Every decode head of mmseg's MODELS registry (tests/decode_heads.py builds each into a
small segmentor) through the two inference paths that take their logits from
mmcirc.apis.decode, on one image whose sides are odd and not multiples of any stride:

* one process (:func:`mmcirc.apis.highres.predict_labels`, the library of
  ``tools/infer_highres.py``): the labels equal mmseg's own ``inference_model`` on the
  same model and image file, or, where mmseg predicts no labels, a one-line ValueError;
* sharded at P = 2 and 3 (:mod:`mmcirc.distributed.segmentor`, every head in one launch
  per P): the same labels, or a one-line ValueError from ``shard_model`` (before any
  image) that names the module and the op.

The decode-head table of docs/sharded.md is what this test observes."""

import functools
import os
import os.path as osp
import re

import cv2
import numpy as np
import pytest
import torch

from decode_heads import head_cases, registry_heads
from helpers import REPO
from mmcirc.distributed import run_parallel

pytestmark = pytest.mark.usefixtures('one_torch_thread')
CASES = head_cases()
DOCS = osp.join(REPO, 'docs', 'sharded.md')
BEGIN, END = '<!-- decode heads: begin -->', '<!-- decode heads: end -->'


def _image(hw):
    rng = np.random.RandomState(0)
    small = rng.randint(0, 256, (9, 7, 3)).astype(np.uint8)
    return cv2.resize(small, hw[::-1], interpolation=cv2.INTER_CUBIC)  # (H, W, 3)


def _sharpen(model):
    """Random weights give nearly constant logits; a wider classifier gives many labels."""
    from mmcirc.apis.decode import predict_head

    head = predict_head(model)
    conv = getattr(head, 'conv_seg', None)
    # the classifier, or (heads that score masks and classes) every linear layer
    layers = [conv] if isinstance(conv, torch.nn.Conv2d) else [
        m for m in head.modules() if isinstance(m, torch.nn.Linear)
    ]  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():
        for layer in layers:
            layer.weight.normal_(0, 2.0 if layer is conv else 0.5)


@pytest.fixture(scope='module')
def one_process(tmp_path_factory):
    """case -> dict(model, ref: mmseg's labels or None, labels | error: ours)."""
    from mmseg.apis import inference_model

    from mmcirc.apis import build_model
    from mmcirc.apis import highres as hr

    tmp = tmp_path_factory.mktemp('decode_heads')

    @functools.lru_cache(maxsize=None)
    def run(case):
        spec = CASES[case]
        path = str(tmp / f'{case}.png')
        cv2.imwrite(path, _image(spec['hw']))
        cfg = hr.load_highres_config(spec['write'](tmp, case))
        model = build_model(cfg, seed=0, init_weights=spec['init_weights'])
        if not spec['init_weights']:  # parameters the constructors leave empty: drawn
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() > 1:
                        p.normal_(0, 0.5)
        _sharpen(model)
        model.cfg.test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackSegInputs')]
        torch.manual_seed(0)  # heads that draw random numbers at inference (Hamburger's NMF)
        sample = inference_model(model, path)
        ref = sample.pred_sem_seg.data[0].numpy() if 'pred_sem_seg' in sample else None
        out = dict(model=model, ref=ref, fields=sorted(sample.keys()))
        torch.manual_seed(0)
        try:
            out['labels'], times = hr.predict_labels(model, cv2.imread(path, cv2.IMREAD_COLOR))
            out['upsample'] = times['upsample']
        except ValueError as err:
            out['error'] = str(err)
        return out

    return run


def test_the_registry_walk_finds_every_kind_of_head():
    heads = registry_heads()
    assert {'FCNHead', 'DAHead', 'OCRHead', 'PointHead', 'MaskFormerHead'} <= set(heads)
    assert not {'KernelUpdateHead', 'KernelUpdator'} & set(heads)  # parts of K-Net's head
    assert {c['head'] for c in CASES.values()} == set(heads)


@pytest.mark.parametrize('case', list(CASES))
def test_one_process_labels_equal_mmseg_inference_model(one_process, case):
    run = one_process(case)
    if run['ref'] is None:  # mmseg predicts no labels (a depth map): refused in one line
        assert 'pred_sem_seg' not in run['fields'] and 'labels' not in run
        assert len(run['error'].splitlines()) == 1
        assert re.match(r'^segmentor \w+: a postprocess_result of its own', run['error'])
        return
    assert 'error' not in run, run.get('error')
    assert run['labels'].shape == CASES[case]['hw']
    assert len(np.unique(run['ref'])) > 1, 'one label everywhere: a comparison that cannot fail'
    np.testing.assert_array_equal(run['labels'], run['ref'])


@pytest.mark.parametrize('case', ['DAHead', 'OCRHead', 'PointHead', 'MaskFormerHead'])
def test_tuples_cascades_and_mask_heads_take_the_banded_resize(one_process, case):
    """DAHead's forward returns three maps, OCRNet and PointRend are cascades,
    MaskFormer makes its logits at the image size: all through encode_logits."""
    assert one_process(case)['upsample'] == 'banded'


def _shard_all(runs):
    """Every case on this rank: shard_model (refusals recorded) then predict_sharded."""
    from mmcirc.distributed.segmentor.model import predict_sharded, shard_model

    out = {}
    for case, run in runs.items():
        try:
            sharded = shard_model(run['model'])
        except ValueError as err:
            out[case] = ('refused', str(err))
            continue
        torch.manual_seed(0)
        hw = CASES[case]['hw']
        out[case] = ('labels', predict_sharded(sharded, _image(hw), hw)[0])
    return out


@pytest.fixture(scope='module')
def sharded(one_process):
    """P -> rank 0's {case: ('labels', (H, W) tensor) | ('refused', message)}: one
    launch per world size, every head in it."""
    runs = {case: one_process(case) for case in CASES}
    torch.set_num_threads(1)
    out = {}
    for p in (2, 3):
        ranks = run_parallel(_shard_all, p, args=(runs,))
        for r in ranks[1:]:  # the same refusals everywhere, labels on rank 0 only
            assert {c: v for c, v in r.items() if v[0] == 'refused'} == {
                c: v for c, v in ranks[0].items() if v[0] == 'refused'
            }
        out[p] = ranks[0]
    return out


#: module: sharded inference: <op> ...  (or the segmentor / backbone / head refused whole)
REFUSAL = re.compile(
    r'^(?P<module>[\w.]+(?: \w+)?): (?:sharded inference: (?P<op>\S+)|(?P<what>.+?);)'
)


@pytest.mark.parametrize('p', [2, 3])
@pytest.mark.parametrize('case', list(CASES))
def test_sharded_labels_equal_mmseg_or_refused_in_one_line(one_process, sharded, case, p):
    kind, value = sharded[p][case]
    ref = one_process(case)['ref']
    if kind == 'refused':
        assert len(value.splitlines()) == 1
        assert REFUSAL.match(value), value
        return
    assert ref is not None, f'{case}: sharded labels where mmseg predicts none'
    np.testing.assert_array_equal(value.numpy(), ref)


def _reason(message: str) -> str:
    """A refusal shortened for the table: the module and the op (or what it uses)."""
    text = message.split('; sharded inference supports')[0].split('; high-resolution')[0]
    text = text.replace('sharded inference: ', '').replace(
        ' has no handler for a row-banded map', ''
    )
    return f'refused: `{text}`'.replace('|', '\\|')


def _sharded_cell(case, sharded) -> str:
    """'equal' / the refusal, once when P = 2 and 3 agree."""
    cells = [
        'equal' if sharded[p][case][0] == 'labels' else _reason(sharded[p][case][1]) for p in (2, 3)
    ]
    return cells[0] if cells[0] == cells[1] else f'P = 2: {cells[0]}; P = 3: {cells[1]}'


#: How the one process made its labels (predict_labels' ``upsample``).
UPSAMPLE = {'banded': 'banded resize', 'mmseg': "mmseg's test_step"}


def table(one_process, sharded) -> str:
    """The docs table: one row per case."""
    rows = [
        '| decode head | built | image | one process | sharded, P = 2 and 3 |',
        '|---|---|---|---|---|',
    ]
    for case, spec in CASES.items():
        run = one_process(case)
        one = f'equal ({UPSAMPLE[run["upsample"]]})' if 'labels' in run else _reason(run['error'])
        name = spec['head'] + (f' ({spec["backbone"]})' if case != spec['head'] else '')
        hw = '{}x{}'.format(*spec['hw'])
        rows.append(f'| {name} | {spec["built"]} | {hw} | {one} | {_sharded_cell(case, sharded)} |')
    return '\n'.join(rows)


def test_docs_table_is_what_this_test_observes(one_process, sharded):
    """MMCIRC_WRITE_DOCS=1 writes the observed table into docs/sharded.md first."""
    text = open(DOCS).read()
    assert BEGIN in text and END in text
    observed = table(one_process, sharded)
    if os.environ.get('MMCIRC_WRITE_DOCS') == '1':
        head, rest = text.split(BEGIN)
        text = f'{head}{BEGIN}\n{observed}\n{END}{rest.split(END)[1]}'
        with open(DOCS, 'w') as f:
            f.write(text)
    documented = text.split(BEGIN)[1].split(END)[0].strip()
    assert documented == observed, f'docs/sharded.md should read:\n{observed}'
