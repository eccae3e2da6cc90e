"""Environment tool calls per second and evaluator time per task, for both tau2 domains.

Replays every task's gold actions through the project's tools (on fresh copy-on-write databases)
and times the calls, then times the evaluator (two replays and hashes, plus the COMMUNICATE check)
per task.

    python benchmarks/tau2_env.py [DATA_DIR]      (default: $SCOPE_TAU2_DATA or ../shared/data/tau2)
"""
from __future__ import annotations

import argparse
import os
import time

from scope.envs.tau2.env import load_domain
from scope.envs.tau2.db import OverlayDB
from scope.envs.tau2.env import evaluate
from scope.envs.tau2.tooling import ToolError
from scope.envs.tau2.tools import call_tool
from report import report  # benchmarks/report.py (a script's own directory is on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser(description="tau2 tool calls per second and evaluator time, both domains")
    ap.add_argument("data_dir", nargs="?", default=os.environ.get("SCOPE_TAU2_DATA", "../shared/data/tau2"))
    root = ap.parse_args().data_dir
    for domain in ("retail", "airline"):
        t = time.perf_counter()
        data = load_domain(root, domain)
        load_s = time.perf_counter() - t
        calls, t = 0, time.perf_counter()
        for _ in range(5):
            for task in data["tasks"].values():
                db = OverlayDB(data["db"])
                for a in task["evaluation_criteria"].get("actions") or []:
                    try:
                        call_tool(domain, db, a["name"], a["arguments"])
                    except ToolError:
                        pass
                    calls += 1
        dt = time.perf_counter() - t
        t = time.perf_counter()
        for task in data["tasks"].values():
            crit = task["evaluation_criteria"]
            evaluate(domain, data, task, crit.get("actions") or [], [str(crit.get("communicate_info"))], "user")
        ev = (time.perf_counter() - t) / len(data["tasks"])
        print(f"{domain}: load {load_s:.2f}s; {calls} tool calls in {dt:.2f}s = {calls / dt:.0f} calls/s; "
              f"evaluator {ev * 1e3:.2f} ms per task ({len(data['tasks'])} tasks)")
        report(f"tau2_{domain}", calls_per_s=calls / dt, evaluator_ms=ev * 1e3)


if __name__ == "__main__":
    main()
