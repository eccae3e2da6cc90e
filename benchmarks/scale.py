"""Scale-out figures on the embedded model, side by side in one run: the same training run three ways.

- ``in-process``: dialogues sampled by scope's own CPU decode loop in the training process;
- ``vllm``: sampled by a vLLM (CPU build) engine that scope starts on 127.0.0.1 (``--block-size 32``),
  the agent's adapter synced to it after every update;
- ``ray x2``: dialogues split over 2 Ray workers (1 thread each), adapters sent by version.

Each run: P4G, a LoRA agent against the frozen base as partner, 8 tasks x 4 = 32 dialogues a step, 3
agent turns, up to 48 new tokens a reply, ``--steps`` steps. Start-up (loading, the engine, Ray) is
outside every figure, and the first step is a warm-up: rollout tokens/s is all tokens over all rollout
seconds of the later steps. Sync time per update is the engine's (write the adapter, register it) and
the workers' (read it, put it in Ray's store, load it in each worker), over the same steps. Runs in the
scale venv (``make scale-env``); on a 2-core machine the three share the same 2 cores.

    .venv-scale/bin/python benchmarks/scale.py [--steps 4] [--only in-process,vllm,ray]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from report import report  # benchmarks/report.py (a script's own directory is on sys.path)

MODES = ("in-process", "vllm", "ray")


def config(mode: str, run_dir: str, steps: int) -> dict:
    model: dict = {"path": "smollm2-135m", "lora": {"r": 8, "alpha": 16}}
    if mode == "vllm":
        model.update(backend="vllm", vllm={"extra_args": ["--block-size", "32"], "max_loras": 2})
    return {"run": {"dir": run_dir, "save_every": 1000, "keep_checkpoints": 1, "progress": False, "threads": 2,
                    "save_rollouts": False},
            "models": {"policy": model},
            "agent": {"model": "policy", "trainable": True, "temperature": 0.7, "max_new_tokens": 48},
            "partner": {"model": "policy", "temperature": 0.7, "max_new_tokens": 48},
            "env": {"name": "p4g", "options": {"max_turns": 3}},
            "rollout": {"n_tasks": 8, "group_size": 4, "end_on_truncation": False,
                        "workers": 2 if mode == "ray" else 0},
            "ray": {"threads_per_worker": 1, "cpus_per_worker": 1},
            "train": {"steps": steps, "lr": 1e-4}}


def measure(mode: str, steps: int) -> dict[str, float]:
    from scope.config import parse_config
    from scope.run import read_metrics
    from scope.train import train

    with tempfile.TemporaryDirectory(prefix=f"scope-bench-{mode}-") as d:
        t = time.time()
        train(parse_config(config(mode, os.path.join(d, "run"), steps)), log=lambda s: None)
        wall = time.time() - t
        ms = read_metrics(os.path.join(d, "run"))
    if len(ms) != steps or any(m["failed_episodes"] for m in ms):
        raise SystemExit(f"{mode}: the run did not complete cleanly: "
                         f"{[(m['step'], m['failed_episodes']) for m in ms]}")
    later = ms[1:]
    tok = sum(m["tokens_generated"] for m in later)
    sec = sum(m["rollout_seconds"] for m in later)
    out = {"tok_s": tok / sec, "tokens": tok, "rollout_s": sec, "wall_s": wall}
    prefix = {"vllm": "engine/policy/", "ray": "ray/"}.get(mode)
    if prefix:  # cumulative counters: the later steps' share
        syncs = ms[-1][prefix + ("syncs" if mode == "vllm" else "weight_syncs")] - \
            ms[0][prefix + ("syncs" if mode == "vllm" else "weight_syncs")]
        secs = ms[-1][prefix + "sync_seconds"] - ms[0][prefix + "sync_seconds"]
        out.update(syncs=syncs, sync_ms=1000 * secs / max(syncs, 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--only", default=",".join(MODES))
    a = ap.parse_args()
    modes = a.only.split(",")
    if a.steps < 2 or any(m not in MODES for m in modes):
        ap.error(f"--steps >= 2; --only from {MODES}")
    try:
        import ray  # noqa: F401
        import vllm  # noqa: F401
    except ImportError as e:
        sys.exit(f"needs the scale venv (make scale-env; .venv-scale/bin/python benchmarks/scale.py): {e}")
    res = {}
    for m in modes:
        print(f"== {m}", flush=True)
        res[m] = measure(m, a.steps)
        r = res[m]
        extra = f", {r['syncs']:.0f} syncs, {r['sync_ms']:.0f} ms per sync" if "sync_ms" in r else ""
        print(f"{m}: {r['tokens']:.0f} tokens in {r['rollout_s']:.1f} s of rollout = {r['tok_s']:.1f} tok/s"
              f"{extra} (run {r['wall_s']:.0f} s with start-up)", flush=True)
    base = res.get("in-process")
    print(f"\n{'mode':>12} {'rollout tok/s':>14} {'vs in-process':>14} {'sync ms/update':>15}")
    for m, r in res.items():
        ratio = f"{r['tok_s'] / base['tok_s']:.2f}x" if base else "n/a"
        sync = f"{r['sync_ms']:.0f}" if "sync_ms" in r else "-"
        print(f"{m:>12} {r['tok_s']:>14.1f} {ratio:>14} {sync:>15}")
    figures = {}
    for m, r in res.items():
        key = m.replace("-", "_")
        figures[f"{key}_tok_s"] = r["tok_s"]
        if "sync_ms" in r:
            figures[f"{key}_sync_ms"] = r["sync_ms"]
        if base and m != "in-process":
            figures[f"{key}_ratio"] = r["tok_s"] / base["tok_s"]
    report("scale", **figures)


if __name__ == "__main__":
    main()
