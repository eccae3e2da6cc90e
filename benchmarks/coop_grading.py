"""The host's cost of taking a cooperative-coding workspace into its patch, at the grading bounds: about
MAX_PATCH_FILES small files, one file near MAX_PATCH_BYTES, and a workspace past the file bound (refused).
Prints each case's seconds, the patch size, and the peak resident set of the host-side git processes.

    python benchmarks/coop_grading.py
"""
from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time

from report import report  # benchmarks/report.py (a script's own directory is on sys.path)


def main() -> None:
    from scope.envs.coop.evaluate import MAX_PATCH_BYTES, MAX_PATCH_FILES, GradingLimit, init_repo, take_patch

    d = tempfile.mkdtemp(prefix="scope-bench-grading-")
    base = os.path.join(d, "base")
    os.makedirs(base)
    with open(os.path.join(base, "a.py"), "w") as f:
        f.write("x = 1\n")
    figures = {}
    cases = (("files", f"{MAX_PATCH_FILES - 10} small files"),
             ("big", f"one file of {(MAX_PATCH_BYTES >> 20) - 4} MB"),
             ("over", f"{MAX_PATCH_FILES + 5000} small files (past the bound)"))
    try:
        for key, label in cases:
            ws, gitdir = os.path.join(d, "ws-" + key), os.path.join(d, "git-" + key)
            init_repo(base, ws)
            shutil.copytree(os.path.join(ws, ".git"), gitdir)
            if key == "big":
                with open(os.path.join(ws, "big.bin"), "wb") as f:
                    f.write(os.urandom(MAX_PATCH_BYTES - (4 << 20)))
            else:
                for i in range(MAX_PATCH_FILES - 10 if key == "files" else MAX_PATCH_FILES + 5000):
                    with open(os.path.join(ws, f"f{i}.txt"), "w") as f:
                        f.write(f"{i}\n")
            t0 = time.monotonic()
            try:
                what = f"a patch of {len(take_patch(ws, gitdir)) >> 20} MB"
            except GradingLimit as e:
                what = f"refused ({e})"
            sec = time.monotonic() - t0
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            print(f"{label}: {sec:.1f} s, {what}; host-side git's peak resident set so far {peak:.0f} MB")
            figures[f"{key}_s"] = sec
        figures["git_peak_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    finally:
        shutil.rmtree(d, ignore_errors=True)
    report("coop_grading", **figures)


if __name__ == "__main__":
    main()
