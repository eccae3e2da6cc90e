"""Two adapters on one base, their updates alternating (Co-Training's learner pattern): the update's
transient memory with glibc's mmap threshold left dynamic (its default) and pinned (what scope's learner
does), side by side.

Each setting runs in its own process: SmolLM2 with LoRA adapters ``agent`` and ``partner``, the same
kind of 16-sequence batch (220-300 tokens, 60 of them trained) for every update, in the order
``--seq`` (A: agent, P: partner). For each update it prints the resident set where the update started
(after malloc_trim) and its peak; the figure is each setting's largest agent-update transient (peak -
start) after the partner has trained, against the second agent update's, before it (the first update also
allocates what every later one reuses). Goal: flat, <= 1.10x.

    python benchmarks/alternating_updates.py [--seq AAPAPA]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

from report import report, rss_mb, track_peak  # benchmarks/report.py (a script's own directory is on sys.path)


def child(pinned: bool, seq: str) -> None:
    import torch

    from scope import learner as L
    from scope.models.loading import load_backend
    from scope.types import Trace

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    if not pinned:
        L.pin_mmap_threshold = lambda nbytes=0: False  # glibc's default, dynamic threshold
    be = load_backend("smollm2-135m")
    be.add_lora("agent")
    be.add_lora("partner")
    rng = random.Random(0)

    def batch(n: int = 16) -> list[Trace]:
        out = []
        for _ in range(n):
            t = Trace(role="x")
            t.extend_context([rng.randrange(1000, 20000) for _ in range(rng.randint(160, 240))])
            t.extend_generated([rng.randrange(1000, 20000) for _ in range(60)], [-2.0] * 60, ("m", 0))
            out.append(t)
        return out

    cfg = L.LearnerConfig(lr=1e-4, kl_coef=0.01)
    learners = {"A": L.Learner(be, "agent", cfg), "P": L.Learner(be, "partner", cfg)}
    peak = track_peak()
    rows = []
    for c in seq:
        tr = batch()
        L.release_free_memory()
        start = rss_mb()
        peak[0] = start
        t0 = time.time()
        learners[c].update(tr, [rng.choice([-1.0, 1.0]) for _ in tr])
        rows.append({"role": "agent" if c == "A" else "partner", "start": start, "peak": peak[0],
                     "seconds": time.time() - t0})
        r = rows[-1]
        print(f"  {'pinned' if pinned else 'dynamic'}: {r['role']:7s} update, start {start:.0f} MB, peak "
              f"{r['peak']:.0f} MB, transient {r['peak'] - start:.0f} MB ({r['seconds']:.0f} s)",
              file=sys.stderr, flush=True)
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", default="AAPAPA", help="update order: A agent, P partner (starting AAP)")
    ap.add_argument("--child", choices=["dynamic", "pinned"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.seq.startswith("AAP") or "A" not in a.seq[3:]:
        ap.error("--seq starts with AAP (two agent updates, then the partner's) and has an agent update after it")
    if a.child:
        child(a.child == "pinned", a.seq)
        return
    res = {}
    for mode in ("dynamic", "pinned"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--seq", a.seq], stdout=subprocess.PIPE,
                             text=True, check=True)
        res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print("\n| threshold | agent-update transients (MB), in order | largest after the partner's / second |"
          " update seconds (mean) |")
    print("|---|---|---|---|")
    figures = {}
    for mode, rows in res.items():
        tr = [r["peak"] - r["start"] for r in rows if r["role"] == "agent"]
        ratio = max(tr[2:]) / tr[1]  # agent updates 3.. come after the partner's first update
        figures[f"{mode}_transient_ratio"] = ratio
        figures[f"{mode}_max_transient_mb"] = max(tr)
        secs = sum(r["seconds"] for r in rows) / len(rows)
        print(f"| {mode} | {', '.join(f'{x:.0f}' for x in tr)} | {ratio:.2f}x | {secs:.1f} |")
    share = figures["pinned_max_transient_mb"] / figures["dynamic_max_transient_mb"]
    print(f"\npinned / dynamic largest agent transient: {share:.2f}x (goal: pinned flat, <= 1.10x)")
    report("alternating_updates", **figures)


if __name__ == "__main__":
    main()
