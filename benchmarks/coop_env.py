"""Cooperative coding: sandboxed command calls per second, and the time of a full pair evaluation.

- calls/s: ``true`` and ``ls`` run ``--calls`` times each in one sandbox (bubblewrap, a cgroup of the
  call's own), against the same commands as plain subprocesses (no sandbox), side by side;
- pair evaluation: the suite's ``textkit`` pairs graded end to end (filter, branches, merge, each
  feature's hidden tests run by pytest in the sandbox), mean seconds per pair.

    python benchmarks/coop_env.py [--calls 200]
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
import time

from report import report  # benchmarks/report.py (a script's own directory is on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    from scope.envs.coop.evaluate import evaluate_pair
    from scope.envs.coop.sandbox import Limits, Sandbox, make_workspace, remove_workspace
    from scope.envs.coop.tasks import load_pairs

    with tempfile.TemporaryDirectory() as d:
        ws = make_workspace(d + "/ws")  # as an episode makes it: a tmpfs with its quota where root may mount
        box = Sandbox(ws, Limits(wall_seconds=30))
        print(f"workspace quota held by {'a tmpfs' if box.kernel_quota else 'a running total'}; "
              f"{'a second bubblewrap with a user namespace' if box.nested_userns else 'no nested user namespace'}",
              flush=True)
        rates = {}
        for cmd in ("true", "ls"):
            t = time.perf_counter()
            for _ in range(a.calls):
                r = box.run(cmd)
                assert r.exit_code == 0, r.output
            sandboxed = a.calls / (time.perf_counter() - t)
            t = time.perf_counter()
            for _ in range(a.calls):
                subprocess.run(["/bin/sh", "-c", cmd], cwd=ws, capture_output=True, check=True)
            plain = a.calls / (time.perf_counter() - t)
            rates[cmd] = sandboxed
            print(f"{cmd!r}: {sandboxed:.0f} calls/s sandboxed ({1000 / sandboxed:.1f} ms a call), "
                  f"{plain:.0f} calls/s as plain subprocesses ({1000 / plain:.1f} ms); ratio {plain / sandboxed:.1f}x",
                  flush=True)
        remove_workspace(ws)
    pairs = [p for p in load_pairs(None, "train") if p.id.startswith("textkit_task/")]
    t = time.perf_counter()
    outcomes = []
    for p in pairs:
        fa, fb = p.data["features"]
        r = evaluate_pair(p.data["repo_dir"], {"agent1": fa["reference_patch"], "agent2": fb["reference_patch"]},
                          {fa["name"]: fa["tests_patch"], fb["name"]: fb["tests_patch"]},
                          lambda w: Sandbox(w, Limits(wall_seconds=120)))
        outcomes.append(r.success)
    per_pair = (time.perf_counter() - t) / len(pairs)
    print(f"full pair evaluation (2 branches, merge, 2 hidden-test runs): {per_pair:.2f} s a pair over "
          f"{len(pairs)} pairs ({sum(outcomes)} succeeded)")
    report("coop_env", calls_per_s=rates["true"], ls_calls_per_s=rates["ls"], pair_eval_s=per_pair)


if __name__ == "__main__":
    main()
