"""tools/analysis/get_flops.py takes mmdet's own get_flops.py command line
(``--num-images N --cfg-options k=v``) and counts the images at the size mmdet's tool
reports for them (mmdet's shipped tools/analysis_tools/get_flops.py is the reference)."""

import ast
import json
import os.path as osp
import re

import mmdet

from helpers import FIXTURE_CONFIGS, run_tool

CONFIG = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')
MMDET_GET_FLOPS = osp.join(
    osp.dirname(mmdet.__file__), '.mim', 'tools', 'analysis_tools', 'get_flops.py'
)
# one command line for both tools: mmdet's two flags
ARGS = [CONFIG, '--num-images', '2', '--cfg-options', 'val_dataloader.dataset.indices=2']


def test_num_images_counts_the_val_images_at_the_size_mmdet_gives_them(toy_root, tmp_path):
    out = tmp_path / 'flops.json'
    run_tool(['tools/analysis/get_flops.py', *ARGS, '--out-json', str(out)], cwd=toy_root)
    ours = json.loads(out.read_text())
    theirs = run_tool([MMDET_GET_FLOPS, *ARGS], cwd=toy_root).stdout
    shape = ast.literal_eval(re.search(r'Input shape: (\(.*?\))', theirs).group(1))
    assert ours['num_images'] == 2 and tuple(ours['shape']) == tuple(shape)

    # the images' mean is the count of one input of that size (RetinaNet's tensor
    # forward does not depend on the image content)
    single = tmp_path / 'single.json'
    run_tool(
        ['tools/analysis/get_flops.py', CONFIG, '--shape', *map(str, shape)]
        + ['--out-json', str(single)],
        cwd=toy_root,
    )
    assert ours['flops'] == json.loads(single.read_text())['flops']


def test_num_images_and_shape_exclude_each_other(toy_root):
    proc = run_tool(
        ['tools/analysis/get_flops.py', CONFIG, '--num-images', '2', '--shape', '64'],
        cwd=toy_root,
        check=False,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith('error: --shape and --num-images')
