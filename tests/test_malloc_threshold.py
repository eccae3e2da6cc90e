"""The learner fixes glibc's mmap threshold: freed activation-sized blocks go back to the OS at once,
instead of staying in a heap whose threshold grew with the largest block freed so far (which made the
update's peak grow step after step when two adapters alternate: issue-level figures in
scope/learner.py's pin_mmap_threshold, the goal in benchmarks/population.py)."""
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, sys
from scope.models.loading import load_backend
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


def test_the_command_line_runs_itself_on_jemalloc_where_installed(tmp_path):
    """``scope`` re-executes itself with jemalloc preloaded (flat update peaks without the pinned threshold's
    cost); SCOPE_ALLOCATOR=glibc keeps glibc (and the learner pins its threshold); a call from Python does not
    re-execute."""
    import os

    from scope.memory import jemalloc_path, reexec_env

    assert reexec_env({"SCOPE_ALLOCATOR": "glibc"}) is None
    assert reexec_env({"LD_PRELOAD": "/x/libjemalloc.so.2"}) is None
    lib = jemalloc_path()
    if lib is None:
        assert reexec_env({}) is None
        pytest.skip("jemalloc is not installed (Debian: apt-get install libjemalloc2)")
    assert reexec_env({"LD_PRELOAD": "/x/other.so"})["LD_PRELOAD"] == f"{lib} /x/other.so"
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(f"run: {{dir: {tmp_path / 'run'}, progress: false, report_to: []}}\n"
                   "models: {policy: {path: tiny-random}}\nagent: {model: policy, trainable: true, max_new_tokens: 4}\n"
                   "partner: {model: policy, max_new_tokens: 4}\n"
                   "env: {name: p4g, options: {max_turns: 1, force_decision: true}}\n"
                   "rollout: {n_tasks: 1, group_size: 2, end_on_truncation: false}\ntrain: {steps: 1}\n")
    for want, extra in (("jemalloc", {}), ("glibc", {"SCOPE_ALLOCATOR": "glibc"})):
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SCOPE_ALLOCATOR")} | extra
        r = subprocess.run([sys.executable, "-m", "scope.cli", "train", "--config", str(cfg), "--set",
                            f"run.dir={tmp_path / want}"], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"allocator {want}" in r.stdout, r.stdout[-2000:]
