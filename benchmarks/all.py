"""Every benchmark, one after another (they share the machine's cores, so never two at once), then one
table: each headline figure beside its goal, so that a change that costs speed or memory shows in the
session that made it. ``make bench`` runs this and writes the table to ``docs/benchmarks.md`` (the latest
figure of each benchmark, with the date it was measured; ``docs/benchmarks.json`` keeps the figures, so a
run with ``--only`` updates its own rows). Earlier figures are in git's history of those files.

    python benchmarks/all.py [--only rollout_throughput,verbalized_sampling,...] [--no-write]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHES = ["rollout_throughput", "verbalized_sampling", "population", "alternating_updates", "learner_memory",
           "decode_step", "panel_readout", "families", "parallel_step", "tau2_env", "coop_env", "coop_grading",
           "koth_game", "scale"]
ROOT = os.path.dirname(HERE)
PYTHON = {"scale": os.path.join(ROOT, ".venv-scale", "bin", "python")}  # vLLM and Ray live in their own venv
OWN_ALLOCATOR = {"alternating_updates", "scale"}
"""Benchmarks run on the allocator the command line runs on (jemalloc where installed: scope/memory.py), except
these: alternating_updates compares glibc's thresholds, and scale's vLLM engine keeps its own."""
SCRIPT = {"tau2_retail": "tau2_env", "tau2_airline": "tau2_env"}  # a report's name -> the script that writes it
# (report, figure): (comparison, goal, unit, what it is)
GOALS = {
    ("rollout_throughput", "ratio_32"): (">=", 8.0, "x", "rollout tokens/s, 32 dialogues together vs one at a time"),
    ("verbalized_sampling", "ratio"): ("<=", 3.0, "x", "rollout wall time, VS partner vs plain partner"),
    ("verbalized_sampling", "parsed_frac"): (">=", 1.0, "", "share of VS turns parsed (no fallback)"),
    ("population", "memory_ratio"): ("<=", 1.15, "x", "peak RSS, Population Co-Training (K=5) vs RL (Single)"),
    ("population", "rss_slope_mb"): ("<=", 50.0, "MB/step", "population's resident set growth per step"),
    ("population", "memory_ratio_20_steps"): ("<=", 1.10, "x",
                                              "peak RSS over 20 steps, Population (K=5) vs RL (Single)"),
    ("population", "switch_ms"): ("<=", 50.0, "ms", "switch to a pool member and back"),
    ("population", "cotrain_step_ratio"): ("<=", 1.7, "x", "step time, Co-Training vs RL (Single)"),
    ("alternating_updates", "pinned_transient_ratio"): ("<=", 1.10, "x",
                                                        "agent-update transient after / before the partner trains"),
    ("alternating_updates", "dynamic_transient_ratio"): (None, None, "x", "the same with glibc's dynamic threshold"),
    ("learner_memory", "transient_gb"): (None, None, "GB", "one learner update's transient, default micro-batch"),
    ("learner_memory", "update_s"): (None, None, "s", "one learner update (16 x ~240 tokens, LoRA)"),
    ("parallel_step", "one_process_s"): (None, None, "s", "one LoRA update (16 x ~240 tokens), one process"),
    ("parallel_step", "ddp_ratio"): (None, None, "x", "the same update over 2 gloo ranks (DDP) vs one process"),
    ("parallel_step", "fsdp_ratio"): (None, None, "x", "the same update over 2 gloo ranks (FSDP2) vs one process"),
    ("decode_step", "prefill_chunked_tok_s"): (None, None, "tok/s", "prefill, 32 x 204 tokens in the engine's chunks"),
    ("panel_readout", "ratio"): (None, None, "x", "a panel's readouts (6 members, 96 prompts), each member alone vs "
                                  "the layers below the adapters shared"),
    ("panel_readout", "identical"): (">=", 1.0, "", "the same readouts to the bit with the sharing (1: yes)"),
    ("families", "gemma3_decode_tok_s"): (None, None, "tok/s", "Gemma 3 270M decode, 16 rows x 32 tokens"),
    ("families", "smollm2_decode_tok_s"): (None, None, "tok/s", "SmolLM2-135M decode, the same work"),
    ("families", "decode_ratio"): (None, None, "x", "decode tokens/s, Gemma 3 270M vs SmolLM2-135M"),
    ("families", "gemma3_update_ms_per_token"): (None, None, "ms", "Gemma 3 270M LoRA update, per trained token"),
    ("families", "smollm2_update_ms_per_token"): (None, None, "ms", "SmolLM2-135M LoRA update, per trained token"),
    ("families", "update_ratio"): (None, None, "x", "update time per trained token, Gemma 3 270M vs SmolLM2-135M"),
    ("tau2_retail", "calls_per_s"): (None, None, "/s", "tau2 retail tool calls"),
    ("tau2_airline", "calls_per_s"): (None, None, "/s", "tau2 airline tool calls"),
    ("coop_env", "calls_per_s"): (None, None, "/s", "sandboxed command calls (true)"),
    ("coop_env", "pair_eval_s"): (None, None, "s", "full evaluation of a coding pair"),
    ("coop_grading", "files_s"): (None, None, "s", "taking a coop patch of ~20,000 small files (the file bound)"),
    ("coop_grading", "big_s"): (None, None, "s", "taking a coop patch of one 60 MB file (near the byte bound)"),
    ("coop_grading", "git_peak_mb"): (None, None, "MB", "host-side git's peak resident set over those"),
    ("koth_game", "agent_steps_per_s"): (">=", 50000.0, "/s", "King of the Hill agent-steps, one core, batched"),
    ("scale", "in_process_tok_s"): (None, None, "tok/s", "rollout tokens/s in-process (32 dialogues)"),
    ("scale", "vllm_ratio"): (None, None, "x", "rollout tokens/s, vLLM-cpu engine vs in-process"),
    ("scale", "ray_ratio"): (None, None, "x", "rollout tokens/s, 2 Ray workers vs in-process"),
    ("scale", "vllm_sync_ms"): (None, None, "ms", "adapter sync per update, vLLM engine"),
    ("scale", "ray_sync_ms"): (None, None, "ms", "adapter sync per update, 2 Ray workers"),
    ("scale", "inproc_vs_vllm_32"): (">=", 1.5, "x", "rollout tok/s, in-process vs the vLLM-cpu engine, 32 dialogues"),
    ("scale", "inproc_vs_vllm_1"): (">=", 1.0, "x", "rollout tok/s, in-process vs the vLLM-cpu engine, one dialogue"),
}


def verdict(cmp: str | None, goal: float | None, v: float, unit: str = "") -> str:
    """met, or NOT MET and by how much (in the figure's unit)."""
    if cmp is None or goal is None:
        return "(no goal)"
    ok = v >= goal if cmp == ">=" else v <= goal
    return "met" if ok else f"NOT MET, by {abs(v - goal):.3g} {unit}".rstrip()


DOCS = os.path.join(ROOT, "docs")


def table(got: dict, when: dict, benches_run: list[str]) -> list[str]:
    rows = ["| figure | measured | goal | verdict | measured on |", "|---|---|---|---|---|"]
    for (bench, key), (cmp, goal, unit, what) in GOALS.items():
        goal_s = "" if cmp is None else f"{cmp} {goal:g} {unit}"
        if (bench, key) not in got:
            if SCRIPT.get(bench, bench) in benches_run:  # it ran, but did not report this figure
                rows.append(f"| {what} | n/a | {goal_s} | not measured | |")
            continue
        v = got[(bench, key)]
        on = when.get((bench, key), "")
        rows.append(f"| {what} | {v:.4g} {unit} | {goal_s} | {verdict(cmp, goal, v, unit)} | {on} |")
    return rows


NOTES = "## Notes"
"""docs/benchmarks.md's hand-written part: measurements behind choices in the code, kept across rewrites."""


def write_docs(got: dict, benches_run: list[str]) -> str:
    """Merge this run's figures into docs/benchmarks.json and rewrite docs/benchmarks.md from it."""
    path = os.path.join(DOCS, "benchmarks.json")
    stored = json.load(open(path)) if os.path.exists(path) else {}
    today = time.strftime("%Y-%m-%d")
    for (bench, key), v in got.items():
        stored.setdefault(bench, {})[key] = v
        stored[bench]["_measured"] = today
        stored[bench].setdefault("_dates", {})[key] = today  # each figure's own date (a run may report some only)
    with open(path, "w") as f:
        json.dump(stored, f, indent=1, sort_keys=True)
    all_got = {(b, k): v for b, figs in stored.items() for k, v in figs.items() if not k.startswith("_")}
    when = {(b, k): figs.get("_dates", {}).get(k, figs.get("_measured", "")) for b, figs in stored.items()
            for k in figs}
    md = os.path.join(DOCS, "benchmarks.md")
    old = open(md).read() if os.path.exists(md) else ""
    notes = old[old.index(NOTES):] if NOTES in old else ""  # the hand-written notes below the table stay
    with open(md, "w") as f:
        f.write("# Benchmarks\n\nWritten by `make bench` (`benchmarks/all.py`): the latest figure of each benchmark on "
                "this project's 2-core CPU machine, beside its goal. Each script prints more than its headline "
                "figures (run it alone for the detail); earlier figures are in the git history of this file.\n\n")
        f.write("\n".join(table(all_got, when, list(stored))) + "\n")
        if notes:
            f.write("\n" + notes)
    return md


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="comma-separated subset of " + ",".join(BENCHES))
    ap.add_argument("--no-write", action="store_true", help="print the table only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    benches = a.only.split(",") if a.only else BENCHES
    unknown = [b for b in benches if b not in BENCHES]
    if unknown:
        ap.error(f"unknown benchmarks {unknown}; choose from {BENCHES}")
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        out = f.name
    env = dict(os.environ, SCOPE_BENCH_JSON=out)
    sys.path.insert(0, ROOT)
    from scope.memory import reexec_env

    cli_env = reexec_env(env) or env
    print(f"allocator: {'jemalloc' if 'libjemalloc' in cli_env.get('LD_PRELOAD', '') else 'glibc'} "
          f"(the command line's), except for {', '.join(sorted(OWN_ALLOCATOR))}", flush=True)
    seconds, failed = {}, []
    for b in benches:
        print(f"== {b}", flush=True)
        python = PYTHON.get(b, sys.executable)
        if not os.path.exists(python):
            print(f"skipped: {python} is missing (make scale-env)", flush=True)
            continue
        t = time.time()
        r = subprocess.run([python, os.path.join(HERE, f"{b}.py")], env=env if b in OWN_ALLOCATOR else cli_env)
        seconds[b] = time.time() - t
        if r.returncode:
            failed.append(b)
    rows = [json.loads(ln) for ln in open(out) if ln.strip()]
    os.remove(out)
    got = {(r["bench"], k): v for r in rows for k, v in r.items() if k != "bench"}
    print("\n" + "\n".join(table(got, {}, benches)))
    print("\n" + ", ".join(f"{b} {s:.0f}s" for b, s in seconds.items()))
    if not a.no_write and got:
        print(f"wrote {write_docs(got, benches)}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
