"""Process memory, the one reader mmcirc's tools and benchmarks use (Linux ``/proc``,
falling back to ``getrusage`` elsewhere)."""

import os
import resource

__all__ = [
    'MB',
    'address_space_bytes',
    'is_out_of_memory',
    'peak_rss_bytes',
    'reset_peak_rss',
    'rss_baseline',
    'rss_bytes',
]

#: Bytes per MiB, the unit of the records' ``*_mb`` figures.
MB = 1024**2


def _statm(field: int) -> int:
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[field]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, IndexError):
        return 0


def address_space_bytes() -> int:
    """Virtual size of this process (what ``RLIMIT_AS`` caps); 0 if unknown."""
    return _statm(0)


def rss_bytes() -> int:
    """Resident set size of this process now; 0 if unknown."""
    return _statm(1)


def peak_rss_bytes() -> int:
    """The kernel's RSS high-water mark of this process (``VmHWM``, which
    :func:`reset_peak_rss` lowers), else ``getrusage``'s maximum (KiB on Linux)."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Lower the high-water mark to the current RSS (``/proc/self/clear_refs``, 5), so
    that :func:`peak_rss_bytes` reports what happens next; False where not allowed."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def rss_baseline():
    """Start a peak-RSS measurement: ``(baseline bytes, per_block)``. The high-water
    mark is lowered to the current RSS where the kernel allows it (``per_block`` True,
    baseline = RSS now); else the baseline is the mark so far and a later
    :func:`peak_rss_bytes` includes what came before."""
    per_block = reset_peak_rss()
    return (rss_bytes() if per_block else peak_rss_bytes()), per_block


#: What the allocators (Python, torch's CPU / CUDA ones, the C++ runtime) say when an
#: allocation fails, lower case.
OOM_MARKERS = (
    "can't allocate memory",
    'cannot allocate memory',
    'not enough memory',
    'out of memory',
    'unable to allocate',
    'std::bad_alloc',
)


def is_out_of_memory(err) -> bool:
    """Whether an exception (or an error text) is an allocation failure: MemoryError,
    torch's ``OutOfMemoryError`` and the messages of :data:`OOM_MARKERS`."""
    if isinstance(err, MemoryError):
        return True
    text = str(err).lower()
    return type(err).__name__ == 'OutOfMemoryError' or any(m in text for m in OOM_MARKERS)
