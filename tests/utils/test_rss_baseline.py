from helpers import touch_fresh_pages

from mmcirc.utils.memory import peak_rss_bytes, rss_baseline, rss_bytes

MB = 1024**2


def test_rss_baseline_then_peak_sees_a_touched_block():
    """After rss_baseline, 128 MiB written and freed again show in the high-water mark
    above the baseline; where the mark could be lowered, the baseline is the RSS of the
    moment, not an earlier peak."""
    touch_fresh_pages(256 * MB)  # an earlier peak the reset must forget
    base, per_block = rss_baseline()
    if per_block:
        assert abs(base - rss_bytes()) < 64 * MB
    touch_fresh_pages(128 * MB)
    assert peak_rss_bytes() - base >= 120 * MB if per_block else peak_rss_bytes() >= base
