"""The backbone override flags (mmcirc.cli.common.add_override_args) in the tools
that gained them: get_flops counts the model the flags describe (the same figures as
the config option written by hand), tools/test.py reports a bad value as one line."""

import json
import os.path as osp

from helpers import FIXTURE_CONFIGS, REPO, run_tool

CLS = osp.join(FIXTURE_CONFIGS, 'core_pvt_cls_tiny.py')  # Core-PVT, bank of 8 cores


def _flops(tmp_path, name, *flags):
    out = tmp_path / f'{name}.json'
    run_tool(
        ['tools/analysis/get_flops.py', CLS, '--shape', '64', '--out-json', str(out), *flags],
        cwd=REPO,
    )
    return json.loads(out.read_text())['flops']


def test_get_flops_num_cores_flag_equals_the_config_option(tmp_path):
    """C' = 2 of the bank of 8 (the full bank counts 1.044 M MACs at 64 px, C' = 2
    0.951 M: a flag that did nothing would not match)."""
    flag = _flops(tmp_path, 'flag', '--num-cores', '2')
    option = _flops(tmp_path, 'option', '--cfg-options', 'model.backbone.num_cores=2')
    assert flag == option


def test_test_tool_bad_override_flag_is_one_error_line(tmp_path):
    ckpt = tmp_path / 'none.pth'
    ckpt.write_bytes(b'')
    proc = run_tool(
        ['tools/test.py', CLS, str(ckpt), '--work-dir', str(tmp_path), '--num-cores', '100'],
        cwd=REPO,
        check=False,
        env=dict(MMCIRC_DEBUG='0'),
    )
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr[-2000:]
    last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith('error: num_cores must') and 'num_cores_max=8' in last, last
