"""The heap settings that let sampling reuse freed key/value slabs (scope.heap)."""
import ctypes
import resource
import sys

import pytest
import torch

from scope import heap


def _glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallopt")
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc(), reason="needs glibc's malloc")
def test_freed_slab_is_reused_without_page_faults():
    assert heap.keep_freed_memory()
    assert heap.keep_freed_memory()  # a second call is a no-op that still reports the setting

    def faults_of_slabs():  # a sampling call's key/value slabs: 30 layers x (keys, values), 12 MB each
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        slabs = [torch.zeros(32, 3, 64, 500) for _ in range(60)]
        f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        del slabs
        return f1 - f0

    first = faults_of_slabs()
    again = faults_of_slabs()
    # with glibc's defaults the second call faults all 720 MB in again (about 180,000 pages)
    assert again < first / 4 + 2000, f"the second set of slabs took {again} page faults, the first {first}"
    heap.release_free_memory()
