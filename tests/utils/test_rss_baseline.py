import numpy as np

from mmcirc.utils.memory import peak_rss_bytes, rss_baseline, rss_bytes

MB = 1024**2


def test_rss_baseline_then_peak_sees_a_touched_block():
    """After rss_baseline, 128 MiB written and freed again show in the high-water mark
    above the baseline; where the mark could be lowered, the baseline is the RSS of the
    moment, not an earlier peak."""
    big = np.ones(256 * MB // 8)  # an earlier peak the reset must forget
    del big
    base, per_block = rss_baseline()
    if per_block:
        assert abs(base - rss_bytes()) < 64 * MB
    block = np.ones(128 * MB // 8)
    del block
    assert peak_rss_bytes() - base >= 120 * MB if per_block else peak_rss_bytes() >= base
