"""mmcirc.cli.common: a checkpoint refused by the safe loader (mmcirc.engine) is one
line naming the flag of the tool in use, without torch's ``weights_only`` advice or
another tool's flag; a config file mmengine cannot read is one line."""

import os
import pickle

import pytest
import torch

from mmcirc.cli.common import CLIError, check_config_file, refusal_line, refused_checkpoints
from mmcirc.cli_errors import error_line
from mmcirc.engine import load_from_local


class RunsCode:
    """Unpickles as a call of os.system (``posix.system``): what a malicious file does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


def _write(path, kind, marker):
    payload = {'state_dict': {}, 'x': RunsCode(marker)}
    if kind == 'zip':
        torch.save(payload, path)
    elif kind == 'legacy':
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    else:
        with open(path, 'wb') as f:
            pickle.dump(payload, f)


@pytest.mark.parametrize('kind', ['zip', 'legacy', 'plain'])
def test_a_refused_pickle_names_the_tools_flag_in_one_line(tmp_path, kind):
    path, marker = tmp_path / 'model.pth', tmp_path / 'ran'
    _write(path, kind, marker)
    with pytest.raises(CLIError) as info:
        with refused_checkpoints('--trust-checkpoint'):
            load_from_local(str(path), map_location='cpu')
    line = str(info.value)
    assert not marker.exists()
    assert '\n' not in line and line.startswith(f'{path}: refused: it would run code (`')
    assert 'system' in line, line
    assert line.endswith('pass --trust-checkpoint') and 'tools/test.py' not in line
    assert 'weights_only' not in line and 'will likely succeed' not in line


def test_a_tool_without_the_flag_names_the_python_way(tmp_path):
    path = tmp_path / 'model.pth'
    _write(path, 'zip', tmp_path / 'ran')
    with pytest.raises(pickle.UnpicklingError) as info:
        load_from_local(str(path), map_location='cpu')
    line = refusal_line(info.value)
    assert line.endswith('mmcirc.engine.trust_checkpoint(path)') and '--trust' not in line


@pytest.mark.parametrize('name', ['model.cfg', 'model.txt', 'model'])
def test_a_config_of_another_kind_is_one_line(tmp_path, name):
    path = tmp_path / name
    path.write_text("model = dict(type='X')\n")
    with pytest.raises(ValueError) as info:  # the commands' main_guard: one error line
        check_config_file(str(path))
    assert (
        error_line(info.value)
        == f'config {path}: a config must be one of .py, .json, .yaml, .yml files'
    )
