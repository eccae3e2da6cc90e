"""The learner's allocator, candidates side by side: for each, the agent-update transient after the partner has
trained against the one before (goal <= 1.10x, flat), the update time against glibc's dynamic threshold in the
same run (goal <= 1.05x) and the peak resident set.

Each candidate runs benchmarks/alternating_updates.py's child in its own process (SmolLM2, adapters ``agent``
and ``partner``, 16-sequence batches, updates in the order ``--seq``), set up only through its environment:
glibc's tunables (``GLIBC_TUNABLES``: a fixed mmap threshold, which also stops its dynamic growth; the trim
threshold and top pad), scope's own pin (``mallopt`` at 128 KiB, what the learner does by default), or another
allocator preloaded (Debian's ``libjemalloc2``, ``libtcmalloc-minimal4``; a candidate whose library is missing is
skipped and says so). The candidates run in turn, then again in reverse order (``--rounds 2``), so that the
machine's drift falls on all of them; each figure is the mean over the rounds.

    python benchmarks/allocators.py [--seq AAPA] [--rounds 2] [--only NAME,...]
    python benchmarks/allocators.py --rollout [--rounds 2] [--only NAME,...]

``--rollout``: the rollout's tokens/s instead (benchmarks/rollout_throughput.py ``--batched-only``, 32 P4G dialogues
together, two batches a candidate and pass), each candidate against the baseline in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from report import report  # benchmarks/report.py

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = "/usr/lib/x86_64-linux-gnu"
MiB = 1024 * 1024
CANDIDATES: dict[str, tuple[str, dict[str, str]]] = {
    # name: (the child's mode: "pinned" calls scope's mallopt pin, "dynamic" does not), environment
    "glibc dynamic (default)": ("dynamic", {}),
    "glibc fixed 128 KiB (scope's pin)": ("pinned", {}),
    "glibc fixed 4 MiB": ("dynamic", {"GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={4 * MiB}"}),
    "glibc fixed 32 MiB, trim 256 MiB, top pad 64 MiB": ("dynamic", {"GLIBC_TUNABLES": ":".join([
        f"glibc.malloc.mmap_threshold={32 * MiB}", f"glibc.malloc.trim_threshold={256 * MiB}",
        f"glibc.malloc.top_pad={64 * MiB}"])}),
    "glibc fixed 128 KiB, arena max 1": ("pinned", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}),
    "jemalloc (LD_PRELOAD)": ("dynamic", {"LD_PRELOAD": f"{LIB}/libjemalloc.so.2"}),
    "tcmalloc (LD_PRELOAD)": ("dynamic", {"LD_PRELOAD": f"{LIB}/libtcmalloc_minimal.so.4"}),
}
BASELINE = "glibc dynamic (default)"


def run(name: str, seq: str) -> list[dict] | None:
    mode, extra = CANDIDATES[name]
    pre = extra.get("LD_PRELOAD")
    if pre and not os.path.exists(pre):
        print(f"  {name}: {pre} is missing (apt-get install libjemalloc2 libtcmalloc-minimal4); skipped",
              file=sys.stderr)
        return None
    env = {**os.environ, **extra}
    print(f"{name} ...", file=sys.stderr, flush=True)
    out = subprocess.run([sys.executable, os.path.join(HERE, "alternating_updates.py"), "--child", mode,
                          "--seq", seq], stdout=subprocess.PIPE, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def figures(rows: list[dict]) -> dict[str, float]:
    tr = [r["peak"] - r["start"] for r in rows if r["role"] == "agent"]
    return {"ratio": max(tr[2:]) / tr[1], "max_transient": max(tr), "peak": max(r["peak"] for r in rows),
            "seconds": sum(r["seconds"] for r in rows) / len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", default="AAPA", help="update order: A agent, P partner (starting AAP)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the candidates, alternating their order")
    ap.add_argument("--only", help="comma-separated candidate names (the baseline always runs)")
    ap.add_argument("--rollout", action="store_true", help="the rollout's tokens/s instead of the learner's update")
    a = ap.parse_args()
    names = list(CANDIDATES)
    if a.only:
        want = {s.strip() for s in a.only.split(",")}
        unknown = want - set(names)
        if unknown:
            ap.error(f"no candidate {sorted(unknown)}; have {names}")
        names = [n for n in names if n == BASELINE or n in want]
    if a.rollout:
        return rollout(names, a.rounds)
    got: dict[str, list[dict[str, float]]] = {}
    for k in range(a.rounds):
        for name in (names if k % 2 == 0 else names[::-1]):
            rows = run(name, a.seq)
            if rows is not None:
                got.setdefault(name, []).append(figures(rows))
    mean = {n: {f: sum(x[f] for x in v) / len(v) for f in v[0]} for n, v in got.items()}
    base = mean[BASELINE]["seconds"]
    print(f"\n{a.rounds} round(s) of --seq {a.seq}, BENCH_THREADS={os.environ.get('BENCH_THREADS', '2')}\n")
    print("| allocator | transient after / before the partner (goal <= 1.10x) | update seconds (mean) | "
          "update time / glibc dynamic (goal <= 1.05x) | largest transient MB | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    out: dict[str, float] = {}
    for n, m in mean.items():
        print(f"| {n} | {m['ratio']:.2f}x | {m['seconds']:.1f} | {m['seconds'] / base:.2f}x | "
              f"{m['max_transient']:.0f} | {m['peak']:.0f} |")
        key = n.split(" (")[0].replace(" ", "_").replace(",", "")
        out[f"{key}_transient_ratio"] = m["ratio"]
        out[f"{key}_time_ratio"] = m["seconds"] / base
    report("allocators", **out)


def rollout(names: list[str], rounds: int) -> None:
    """Each candidate's rollout tokens/s (32 dialogues together), the candidates in turn, then in reverse."""
    got: dict[str, list[float]] = {}
    for k in range(rounds):
        for name in (names if k % 2 == 0 else names[::-1]):
            mode, extra = CANDIDATES[name]
            if mode == "pinned" or (extra.get("LD_PRELOAD") and not os.path.exists(extra["LD_PRELOAD"])):
                continue  # (the pin is the learner's alone; a missing library is skipped)
            print(f"{name} ...", file=sys.stderr, flush=True)
            out = subprocess.run([sys.executable, os.path.join(HERE, "rollout_throughput.py"), "--batched-only",
                                  "--rounds", "2"], stdout=subprocess.PIPE, text=True, check=True,
                                 env={**os.environ, **extra})
            last = out.stdout.strip().splitlines()[-1]
            got.setdefault(name, []).append(float(last.split(":")[1]))
            print(f"  {last}", file=sys.stderr, flush=True)
    base = sum(got[BASELINE]) / len(got[BASELINE])
    print(f"\n{rounds} round(s), rollout tokens/s at 32 dialogues\n")
    print("| allocator | tokens/s (each pass) | mean | / glibc dynamic |")
    print("|---|---|---|---|")
    for n, v in got.items():
        m = sum(v) / len(v)
        print(f"| {n} | {', '.join(f'{x:.1f}' for x in v)} | {m:.1f} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
