"""How scope sets the C heap (glibc malloc) on the CPU: keep freed memory while sampling, trim after training.

Sampling allocates each call's key/value slabs (about 15 MB per layer and per keys or values for 32
rows of 600 tokens) and frees the previous turn's. With glibc's defaults, blocks above a threshold
that starts at 128 KB are mapped on their own and unmapped when freed, and free memory at the top of
the heap goes back to the OS. The next call then takes fresh pages: the kernel faults each 4 KB page
in and zeroes it. Measured with ``benchmarks/rollout_throughput.py``'s workload (32 dialogues, 3
turns; one-off script reading ``getrusage``): 1.43 million minor page faults and 2.7 s of system time
in a 51 s run, and 0.44 million and 1.3 s in the next run of the same process. Dialogues run one at
a time fault almost never (their buffers are small), so this cost falls on the batch alone.

``keep_freed_memory()`` fixes the mapping threshold at 32 MB (glibc's upper limit: larger blocks are
still mapped) and lets up to 1 GB of free memory stay at the top of the heap, so freed slabs are
reused as they are. With it the same two runs had 0.22 and 0.013 million faults and 0.58 and 0.37 s
of system time. ``LocalBackend`` calls it on the CPU (``tune_heap=False`` leaves malloc alone).

``release_free_memory()`` hands freed heap pages back (``malloc_trim``); the learner calls it after
each update, whose large, differently shaped buffers would otherwise stay resident.

Both do nothing where the C library is not glibc.
"""
from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30

_libc = None
_kept = False


def _glibc():
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL("libc.so.6")
            _libc = lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else False
        except (OSError, AttributeError):
            _libc = False
    return _libc


def keep_freed_memory() -> bool:
    """Make glibc keep freed blocks of up to 32 MB for reuse (once per process); True if in effect."""
    global _kept
    lib = _glibc()
    if lib and not _kept:
        _kept = bool(lib.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(lib.mallopt(_M_TRIM_THRESHOLD,
                                                                                       TRIM_THRESHOLD))
    return _kept


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``)."""
    lib = _glibc()
    if lib:
        lib.malloc_trim(0)
