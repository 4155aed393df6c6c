"""mmcirc.cli.infer_highres_record: one image's record (the common fields and those of its
run) and its files (PNGs and the JSON naming them); a whole run of one image, measured,
in tests/tools/test_infer_highres.py."""

import json

import cv2
import numpy as np

from mmcirc.cli import infer_highres_record as hr


def _record(**run):
    common = dict(
        image='a.png', input_size=[2, 3], source_size=[2, 3], config='c.py', checkpoint=None,
        random_weights=True, overrides={}, backbone=dict(type='X'), device='cpu', time_s=1.0,
        peak_rss_mb=2.0, peak_increase_mb=1.0, torch_threads=1, num_classes=3, labels_present=2,
    )  # fmt: skip
    return hr.HighResResult(**common, **run)


SINGLE = {'forward_s', 'upsample', 'baseline_rss_mb', 'peak_is_per_image', 'test_cfg'}
SINGLE |= {'upsample_s', 'cuda_max_allocated_mb', 'quadratic_warning', 'dense_baseline'}
SHARDED = {'sharded', 'world_size', 'bytes_sent', 'per_rank'}


def test_a_record_holds_the_common_fields_and_those_of_its_run():
    single = _record(forward_s=0.5, upsample='banded').to_dict()
    sharded = _record(sharded=True, world_size=2, bytes_sent=10, per_rank=[{}, {}]).to_dict()
    assert SINGLE <= set(single) and not SHARDED & set(single)
    assert SHARDED <= set(sharded) and not SINGLE & set(sharded)
    assert set(single) - SINGLE == set(sharded) - SHARDED
    assert single['test_cfg'] == dict(mode='whole') and sharded['per_rank'] == [{}, {}]


def test_write_result_writes_the_pngs_and_the_record_naming_them(tmp_path):
    labels = np.array([[0, 1, 2], [2, 1, 0]])
    palette = [[255, 0, 0], [0, 255, 0], [0, 0, 255]]  # RGB
    img = np.zeros((2, 3, 3), np.uint8)
    stem = hr.output_stem(str(tmp_path), 'a', (2, 3), 'configs/c.py', dict(num_cores=8))
    hr.write_result(stem, _record(), img, labels, palette, opacity=1.0)
    assert stem == str(tmp_path / 'a_2x3_c_nc8')
    assert (cv2.imread(stem + '_labels.png', cv2.IMREAD_UNCHANGED) == labels).all()
    mask_rgb = cv2.imread(stem + '_mask.png')[..., ::-1]
    assert (mask_rgb == np.array(palette, np.uint8)[labels]).all()
    rec = json.loads(open(stem + '.json').read())
    assert rec['outputs'] == {
        k: f'a_2x3_c_nc8{e}'
        for k, e in dict(
            labels='_labels.png', mask='_mask.png', overlay='_overlay.png', json='.json'
        ).items()
    }
    assert rec['image'] == 'a.png' and 'sharded' not in rec
