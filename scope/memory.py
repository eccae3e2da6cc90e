"""glibc's allocator, held still for the learner: freed pages handed back before and after each update, and the mmap
threshold fixed so that an update's peak does not grow step after step (docs/benchmarks.md, "Notes", has the
measurements behind both)."""
from __future__ import annotations

from typing import Any


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``): the rollout's and the other learner's
    freed buffers are not where this update's stack up."""
    global _TRIM
    if _TRIM is None:
        try:
            import ctypes

            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None  # libc's malloc_trim, or False where there is none

MMAP_THRESHOLD = 128 * 1024
"""Blocks from this size up get their own mapping, returned to the OS when freed (glibc's starting value)."""


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (``mallopt(M_MMAP_THRESHOLD)``, which also stops its dynamic growth), so that an
    update's peak stays flat when two adapters alternate; it costs update time (``SCOPE_PIN_MMAP=0`` keeps glibc's
    default). Idempotent; False where the C library has no ``mallopt``."""
    global _PINNED
    if _PINNED is None:
        try:
            import ctypes

            _PINNED = bool(ctypes.CDLL("libc.so.6").mallopt(-3, int(nbytes)))  # -3: M_MMAP_THRESHOLD
        except (OSError, AttributeError):
            _PINNED = False
    return _PINNED


_PINNED: bool | None = None
