"""A file that is no checkpoint is one line in words (mmcirc.engine.load_from_local, as
mmengine's loader, ``--resume`` and build_model use it): empty, truncated (a zip
checkpoint or a legacy pickle cut short), text; never the exception's repr."""

import pytest
import torch

from mmcirc.engine import CheckpointReadError, find_resumable_checkpoint, load_from_local

STATE = {'state_dict': {'w': torch.arange(4096.0)}, 'meta': {'iter': 2}}


def _file(tmp_path, kind):
    path = tmp_path / f'{kind}.pth'
    if kind == 'empty':
        path.write_bytes(b'')
    elif kind == 'text':
        path.write_text('weights: see https://example.org/model.pth\n')
    else:  # a complete checkpoint of that layout, then cut in half
        torch.save(STATE, path, _use_new_zipfile_serialization=kind == 'zip')
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(
    'kind,words',
    [
        ('empty', 'empty (0 bytes)'),
        ('zip', 'truncated ('),
        ('legacy', 'truncated ('),
        ('text', 'not a checkpoint: text'),
    ],
)
def test_a_file_that_is_no_checkpoint_says_what_is_wrong(tmp_path, kind, words):
    path = _file(tmp_path, kind)
    with pytest.raises(CheckpointReadError) as info:
        load_from_local(str(path), map_location='cpu')
    message = str(info.value)
    assert message.startswith(f'cannot read {path}: {words}'), message
    assert '\n' not in message and 'Error' not in message
    assert isinstance(info.value, ValueError)


def test_resume_names_the_skipped_file_in_words(tmp_path):
    torch.save(STATE, tmp_path / 'iter_2.pth')
    cut = _file(tmp_path, 'zip').rename(tmp_path / 'iter_4.pth')
    path, skipped = find_resumable_checkpoint(str(tmp_path))
    assert path == str(tmp_path / 'iter_2.pth')
    assert [(p, why.split(' (')[0]) for p, why in skipped] == [(str(cut), 'truncated')]
