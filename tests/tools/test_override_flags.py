"""The backbone override flags (mmcirc.cli.common.add_override_args) in the tools
that gained them: get_flops counts the model the flags describe (the same figures as
the config option written by hand), tools/test.py reports a bad value as one line (the
commands' main in this process)."""

import json
import os.path as osp

from helpers import FIXTURE_CONFIGS, REPO, command_state_kept
from mmcirc.cli import get_flops
from mmcirc.cli.test import main as main_test

CLS = osp.join(FIXTURE_CONFIGS, 'core_pvt_cls_tiny.py')  # Core-PVT, bank of 8 cores


def _flops(tmp_path, name, *flags):
    """tools/analysis/get_flops.py's main in this process: the FLOPs it writes."""
    out = tmp_path / f'{name}.json'
    with command_state_kept(REPO):
        get_flops.main([CLS, '--shape', '64', '--out-json', str(out), *flags])
    return json.loads(out.read_text())['flops']


def test_get_flops_num_cores_flag_equals_the_config_option(tmp_path):
    """C' = 2 of the bank of 8 (the full bank counts 1.044 M MACs at 64 px, C' = 2
    0.951 M: a flag that did nothing would not match)."""
    flag = _flops(tmp_path, 'flag', '--num-cores', '2')
    option = _flops(tmp_path, 'option', '--cfg-options', 'model.backbone.num_cores=2')
    assert flag == option


def test_test_tool_bad_override_flag_is_one_error_line(tmp_path, run_main, monkeypatch):
    ckpt = tmp_path / 'none.pth'
    ckpt.write_bytes(b'')
    monkeypatch.setenv('MMCIRC_DEBUG', '0')
    with command_state_kept():
        proc = run_main(
            main_test,
            [CLS, str(ckpt), '--work-dir', str(tmp_path), '--num-cores', '100'],
            REPO,
        )
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr[-2000:]
    last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith('error: num_cores must') and 'num_cores_max=8' in last, last
