import pytest
from helpers import touch_fresh_pages

import mmcirc.utils.memory as memory
from mmcirc.utils.memory import peak_rss_bytes, rss_baseline, rss_bytes

MB = 1024**2


def test_rss_baseline_forgets_an_earlier_peak_and_sees_a_later_block():
    """Where the high-water mark can be lowered, the baseline is the RSS of the moment,
    not an earlier 256 MiB peak, and 128 MiB written and freed after it show above it."""
    touch_fresh_pages(256 * MB)  # an earlier peak the reset must forget
    base, per_block = rss_baseline()
    if not per_block:
        pytest.skip('this kernel refuses /proc/self/clear_refs: the fallback test covers it')
    assert abs(base - rss_bytes()) < 64 * MB
    touch_fresh_pages(128 * MB)
    assert peak_rss_bytes() - base >= 120 * MB


def test_rss_baseline_falls_back_to_the_mark_so_far(monkeypatch):
    """Where the kernel refuses the reset, the baseline is the high-water mark so far,
    which an earlier 256 MiB peak keeps above the RSS of the moment."""
    monkeypatch.setattr(memory, 'reset_peak_rss', lambda: False)
    touch_fresh_pages(256 * MB)
    base, per_block = rss_baseline()
    assert not per_block and base - rss_bytes() >= 250 * MB
