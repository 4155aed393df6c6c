"""mmcirc.cli.infer_highres_dense: the memory-capped dense-attention child of
``tools/infer_highres.py --dense-baseline`` (its end-to-end run is in
tests/tools/test_infer_highres.py)."""

import numpy as np
import pytest

from helpers import tiny_pyramid_config

from mmcirc.cli import infer_highres_dense as db


def test_short_error():
    assert db.short_error('CPU: tried to allocate 68719476736 bytes') == 'cannot allocate 64.0 GiB'
    assert db.short_error('x' * 100) == 'x' * 90


@pytest.mark.parametrize(
    'backbone,kind', [('CAPVT', 'sra'), ('CorePVT', 'sra'), ('CASwin', 'window')]
)
def test_dense_attention_is_the_familys_own(backbone, kind):
    from mmengine.config import Config

    import mmcirc  # noqa: F401  (registration)

    assert db.dense_attention(Config(dict(model=dict(backbone=dict(type=backbone))))) == kind


@pytest.mark.parametrize('backbone', ['CADeiT', 'VECAViT', 'ResNetV1c'])
def test_dense_attention_of_a_backbone_without_one_is_a_value_error(backbone):
    from mmengine.config import Config

    import mmcirc  # noqa: F401  (registration)

    cfg = Config(dict(model=dict(backbone=dict(type=backbone))))
    with pytest.raises(ValueError, match=f"^--dense-baseline needs a pyramid.*'{backbone}'"):
        db.dense_attention(cfg)


def test_dense_baseline_child_reports_out_of_memory(tmp_path):
    """sr ratio 1 at 1024 px: stage 1 wants a 65536 x 65536 attention matrix (16 GiB),
    which a 6 GiB address-space cap refuses at once; the child reports it, with the
    phase and the estimate of that matrix."""
    pytest.importorskip('mmseg')
    import cv2

    cfg = tiny_pyramid_config(tmp_path)
    rng = np.random.RandomState(0)
    img = cv2.resize(
        rng.randint(0, 256, (7, 9, 3)).astype(np.uint8), (1024, 1024), interpolation=cv2.INTER_CUBIC
    )
    res = db.run_dense_baseline(
        cfg, img, mem_cap_gb=6, cfg_options={'model.backbone.sr_ratios': [1, 1, 1, 1]}, timeout=600
    )
    assert res['status'] == 'oom', res
    assert res['stage_attentions'] == ['sra'] * 4 and res['rlimit_as_gb'] == 6
    assert res['failed_during'] == 'inference' and res['time_s'] is not None
    assert res['input_size'] == [1024, 1024] and res['mem_cap_gb'] == 6
    assert res['attention_estimates'][0]['keys'] == 65536


def test_dense_baseline_timeout_is_a_status(tmp_path):
    """A child that does not finish in time is killed and reported, not waited for."""
    pytest.importorskip('mmseg')
    img = np.zeros((64, 64, 3), np.uint8)
    res = db.run_dense_baseline(tiny_pyramid_config(tmp_path), img, timeout=1)
    assert res['status'] == 'timeout' and res['error'] == 'timeout (> 1 s)', res
    assert res['time_s'] is None and res['input_size'] == [64, 64]
