"""The learner fixes glibc's mmap threshold: freed activation-sized blocks go back to the OS at once,
instead of staying in a heap whose threshold grew with the largest block freed so far (which made the
update's peak grow step after step when two adapters alternate: issue-level figures in
scope/learner.py's pin_mmap_threshold, the goal in benchmarks/population.py)."""
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, sys
from scope.models.local import load_backend
from scope.learner import Learner, LearnerConfig
if sys.argv[1] == "learner":
    b = load_backend("tiny-random"); b.add_lora("a"); Learner(b, "a", LearnerConfig())
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
big = libc.malloc(16 << 20); libc.memset(big, 1, 16 << 20); libc.free(big)  # a large block freed
p = libc.malloc(4 << 20); libc.memset(p, 1, 4 << 20)
before = rss(); libc.free(p); after = rss()
print(before - after)
"""


def returned_on_free(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_learner_pins_the_mmap_threshold_so_freed_buffers_leave_the_heap():
    assert returned_on_free("plain") < (1 << 20)  # glibc's default: the 4 MB block stays in the heap
    assert returned_on_free("learner") >= (3 << 20)  # pinned: it had its own mapping, gone when freed
