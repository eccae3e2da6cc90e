"""The learner's memory, held still: the command line runs on jemalloc where it is installed (``reexec_env``);
on glibc's allocator freed pages are handed back before and after each update and the mmap threshold is fixed,
so that an update's peak does not grow step after step (docs/benchmarks.md, "Notes", has the measurements
behind each)."""
from __future__ import annotations

import os
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


# ---- the process's allocator: jemalloc where installed ----------------------------------------------------------
JEMALLOC_PATHS = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                  "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2")
"""Where Debian's ``libjemalloc2`` (and other distributions' jemalloc) put the library."""


def jemalloc_path() -> str | None:
    return next((p for p in JEMALLOC_PATHS if os.path.exists(p)), None)


def allocator() -> str:
    """The allocator this process runs on: ``jemalloc`` where its library is mapped, else ``glibc``."""
    try:
        with open("/proc/self/maps") as f:
            return "jemalloc" if "libjemalloc" in f.read() else "glibc"
    except OSError:
        return "glibc"


def reexec_env(environ: dict[str, str]) -> dict[str, str] | None:
    """The environment in which the command line runs itself again on jemalloc (preloaded), or None: already
    on it, not installed, or not wanted (``SCOPE_ALLOCATOR=glibc``; then the learner pins glibc's mmap
    threshold instead). jemalloc keeps the learner's peak as flat as the pinned threshold does without its cost
    in update time (docs/benchmarks.md, "Notes")."""
    if environ.get("SCOPE_ALLOCATOR", "jemalloc") != "jemalloc" or "libjemalloc" in environ.get("LD_PRELOAD", ""):
        return None
    lib = jemalloc_path()
    if lib is None:
        return None
    pre = environ.get("LD_PRELOAD", "")
    return {**environ, "LD_PRELOAD": f"{lib} {pre}".strip()}
