"""mmcirc.apis.weights and build_model's checkpoint checks: a checkpoint that leaves
weights of the model unset is refused in one line naming them (the reference: the two
state dicts compared key by key, and mmengine's own log message), loaded in part only
when asked; unreadable files are one line; training's summary is one line."""

import logging
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner.checkpoint import load_state_dict

from helpers import FIXTURE_CONFIGS
from mmcirc.apis import (
    OneLineLoadSummary,
    WeightsFit,
    WeightsMismatchError,
    build_model,
    has_random_weights,
)

SEG = osp.join(FIXTURE_CONFIGS, 'ca_pvt_fpn_tiny.py')


def _save(state, path):
    torch.save(dict(state_dict=state, meta={}), path)
    return str(path)


def _other_classes_checkpoint(tmp_path):
    """The same segmentor with 3 classes instead of the config's (a trained model of
    another dataset), saved."""
    cfg = Config.fromfile(SEG)
    cfg.model.decode_head.num_classes = 3  # the config's: 5
    other = build_model(cfg, seed=1)
    return other, _save(other.state_dict(), tmp_path / 'three.pth')


def _shaped_otherwise(a, b):
    """The keys of both state dicts whose shapes differ (the independent reference)."""
    sa, sb = a.state_dict(), b.state_dict()
    return sorted(k for k in sa.keys() & sb.keys() if sa[k].shape != sb[k].shape)


def test_another_class_count_is_refused_naming_the_keys_and_shapes(tmp_path):
    other, ckpt = _other_classes_checkpoint(tmp_path)
    model = build_model(SEG, init_weights=False)
    with pytest.raises(WeightsMismatchError) as info:
        build_model(SEG, ckpt)
    fit = info.value.fit
    assert sorted(k for k, _, _ in fit.mismatched) == _shaped_otherwise(other, model)
    key = 'decode_head.conv_seg.weight'
    n = model.decode_head.num_classes
    assert (key, tuple(other.state_dict()[key].shape), (n, *other.state_dict()[key].shape[1:])) in (
        fit.mismatched
    )
    message = str(info.value)
    assert '\n' not in message and key in message and 'allow_partial_weights=True' in message
    assert f'checkpoint (3, {other.state_dict()[key].shape[1]}, 1, 1)' in message


def test_a_checkpoint_of_another_model_is_refused_naming_missing_keys(tmp_path):
    model = build_model(SEG, seed=0)
    backbone_only = {k: v for k, v in model.state_dict().items() if k.startswith('backbone.')}
    with pytest.raises(WeightsMismatchError) as info:
        build_model(SEG, _save(backbone_only, tmp_path / 'bb.pth'))
    expected = sorted(
        k
        for k in model.state_dict()
        if not k.startswith('backbone.') and 'num_batches_tracked' not in k
    )
    assert sorted(info.value.fit.missing) == expected
    assert f'{len(expected)} missing ({info.value.fit.missing[0]}, ' in str(info.value)


def test_partial_loading_loads_what_fits_and_says_the_rest_is_random(tmp_path):
    other, ckpt = _other_classes_checkpoint(tmp_path)
    model = build_model(SEG, ckpt, allow_partial_weights=True)
    assert has_random_weights(model) and not model.weights_fit.complete
    mismatched = set(_shaped_otherwise(other, model))
    for k, v in other.state_dict().items():
        if k not in mismatched:
            assert torch.equal(model.state_dict()[k], v), k


def test_a_complete_checkpoint_is_not_random_and_extra_keys_are_only_reported(tmp_path):
    model = build_model(SEG, seed=0)
    state = dict(model.state_dict(), **{'auxiliary_head.conv.weight': torch.zeros(2, 2)})
    loaded = build_model(SEG, _save(state, tmp_path / 'extra.pth'))
    assert not has_random_weights(loaded)
    assert loaded.weights_fit.unexpected == ['auxiliary_head.conv.weight']
    assert not has_random_weights(build_model(SEG, _save(model.state_dict(), tmp_path / 'w.pth')))
    assert has_random_weights(build_model(SEG, init_weights=False))


@pytest.mark.parametrize(
    'content',
    [b'', b'model weights, see the README\n', 'truncated'],
    ids=['empty', 'text', 'truncated'],
)
def test_an_unreadable_checkpoint_is_a_one_line_value_error_naming_it(tmp_path, content):
    path = tmp_path / 'bad.pth'
    if content == 'truncated':
        _save(build_model(SEG, init_weights=False).state_dict(), path)
        content = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        build_model(SEG, str(path))
    assert '\n' not in str(info.value) and str(path) in str(info.value)
    words = {b'': 'empty (0 bytes)', b'model weights, see the README\n': 'not a checkpoint: text'}
    assert str(info.value).startswith(f'cannot read {path}: {words.get(content, "truncated (")}')


def test_the_fit_read_from_mmengines_message_is_the_recorded_one(tmp_path):
    """The same mismatch, once from the lists build_model records and once parsed from
    the message mmengine's load_state_dict logs."""
    other, ckpt = _other_classes_checkpoint(tmp_path)
    state = dict(other.state_dict(), **{'extra.weight': torch.zeros(1)})
    del state['neck.lateral_convs.0.conv.bias']
    with pytest.raises(WeightsMismatchError) as info:
        build_model(SEG, _save(state, tmp_path / 'odd.pth'))
    messages = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger('test_weights_fit')
    logger.addHandler(Keep())
    load_state_dict(build_model(SEG, init_weights=False), state, logger=logger)
    (message,) = messages
    assert WeightsFit.from_message(message) == info.value.fit
    assert info.value.fit.missing == ['neck.lateral_convs.0.conv.bias']
    assert info.value.fit.unexpected == ['extra.weight']


def test_training_prints_mmengines_mismatch_report_in_one_line(tmp_path):
    _, ckpt = _other_classes_checkpoint(tmp_path)
    logger = logging.getLogger('test_weights_one_line')
    logger.propagate = False
    logger.addFilter(OneLineLoadSummary())
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record))

    logger.addHandler(Keep())
    model = build_model(SEG, init_weights=False)
    load_state_dict(model, torch.load(ckpt)['state_dict'], logger=logger)
    (line,) = lines
    assert '\n' not in line and line.startswith('loaded weights: 2 shaped otherwise')
    assert 'decode_head.conv_seg.weight: checkpoint (3,' in line
