"""Scale-out figures on the embedded model, side by side in one run: the same rollouts three ways.

- ``in-process``: dialogues sampled by scope's own CPU decode loop in this process;
- ``vllm``: sampled by a vLLM (CPU build) engine that scope starts on 127.0.0.1 (``--block-size 32``);
- ``ray``: dialogues split over 2 Ray workers (1 torch thread each), each with its own model copy.

Each round: P4G, a LoRA agent against the frozen base as partner, 8 tasks x 4 = 32 dialogues, 3 agent
turns, up to 48 new tokens a reply, temperature 0.7, set up as a training run sets them up
(``build_models``, ``make_rollout``, ``step_jobs``). Between rounds the agent's adapter is moved and its
version bumped, as a learner's update does (the update itself is not timed: it is the same in all three),
so every round after the first starts with an adapter sync. Start-up (loading, the engine, Ray) is outside
every figure and the first round is a warm-up: tokens/s is all tokens over all seconds of the later
rounds, sync time per update the engine's (write the adapter, register it) or the driver's for the
workers (read it once, put it in Ray's store, each worker loads it). Runs in the scale venv
(``make scale-env``); on a 2-core machine the three share the same 2 cores.

Then the peer figures, scope's own decode loop against the vLLM engine at 32 dialogues and alone (one
dialogue, the same turns): in-process tokens/s over vLLM's (goals >= 1.5x at 32, >= 1.0x alone).

    .venv-scale/bin/python benchmarks/scale.py [--rounds 3] [--only in-process,vllm,ray] [--alone]
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time

import torch

from report import report  # benchmarks/report.py (a script's own directory is on sys.path)

MODES = ("in-process", "vllm", "ray")


def config(mode: str, run_dir: str, dialogues: int = 32) -> dict:
    model: dict = {"path": "smollm2-135m", "lora": {"r": 8, "alpha": 16}}
    if mode == "vllm":
        model.update(backend="vllm", vllm={"extra_args": ["--block-size", "32"], "max_loras": 2})
    return {"run": {"dir": run_dir, "progress": False, "threads": 2},
            "models": {"policy": model},
            "agent": {"model": "policy", "trainable": True, "temperature": 0.7, "max_new_tokens": 48},
            "partner": {"model": "policy", "temperature": 0.7, "max_new_tokens": 48},
            "env": {"name": "p4g", "options": {"max_turns": 3}},
            "rollout": {"n_tasks": max(1, dialogues // 4), "group_size": min(4, dialogues), "end_on_truncation": False,
                        "workers": 2 if mode == "ray" else 0},
            "ray": {"threads_per_worker": 1, "cpus_per_worker": 1}}


def move(ref, rng: torch.Generator) -> None:
    """What a learner's update does to the serving side: the adapter's weights move, its version goes up."""
    with torch.no_grad():
        for n, p in ref.backend.model.named_parameters():
            if f".{ref.adapter}." in n and "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=rng) * 1e-3)
    ref.backend.versions[ref.adapter] += 1


def measure(mode: str, rounds: int, dialogues: int = 32) -> dict[str, float]:
    from scope.config import parse_config
    from scope.rollout_workers import make_rollout, scale_metrics
    from scope.envs.base import get_env
    from scope.setup import build_models
    from scope.train import step_jobs

    with tempfile.TemporaryDirectory(prefix=f"scope-bench-{mode}-") as d:
        cfg = parse_config(config(mode, d, dialogues))
    torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(0)
    t = time.time()
    backends, sources, trainable = build_models(cfg)
    rollout = make_rollout(cfg, backends)
    start = time.time() - t
    tasks = get_env("p4g").load_tasks("train")
    env_rng, g = random.Random(1), torch.Generator().manual_seed(0)
    tok = sec = 0.0
    before = None
    try:
        for r in range(rounds):
            if r:
                move(trainable["agent"], g)
            n = cfg.rollout.n_tasks
            jobs = step_jobs(cfg, [tasks[(n * r + i) % len(tasks)] for i in range(n)], sources, r + 1, env_rng)
            t = time.time()
            eps, st = rollout(jobs, max_context=cfg.rollout.max_context, end_on_truncation=False)
            dt = time.time() - t
            failed = sum(e.status == "failed" for e in eps)
            if failed:
                raise SystemExit(f"{mode}: {failed} of {len(eps)} episodes failed in round {r + 1}: "
                                 f"{next(e.error for e in eps if e.status == 'failed')}")
            print(f"  round {r + 1}: {st.tokens_generated} tokens in {dt:.1f} s = {st.tokens_generated / dt:.1f} tok/s"
                  + ("  (warm-up)" if r == 0 else ""), flush=True)
            if r == 0:
                before = scale_metrics(rollout, backends)
            else:
                tok, sec = tok + st.tokens_generated, sec + dt
        after = scale_metrics(rollout, backends)
    finally:
        for b in backends.values():
            if hasattr(b, "close"):
                b.close()  # the engine
        if mode == "ray":
            import ray

            ray.shutdown()
    out = {"tok_s": tok / sec, "tokens": tok, "seconds": sec, "start_s": start}
    key = {"vllm": ("engine/policy/syncs", "engine/policy/sync_seconds"),
           "ray": ("ray/weight_syncs", "ray/sync_seconds")}.get(mode)
    if key:  # cumulative counters: the later rounds' share
        n = after[key[0]] - before[key[0]]
        out.update(syncs=n, sync_ms=1000 * (after[key[1]] - before[key[1]]) / max(n, 1))
        if mode == "ray":  # a sync is one adapter to one worker; an update reaches both workers
            out["sync_ms"] *= cfg.rollout.workers
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=",".join(MODES))
    ap.add_argument("--alone", action=argparse.BooleanOptionalAction, default=True,
                    help="also in-process and vllm with one dialogue (the peer figure alone)")
    a = ap.parse_args()
    modes = a.only.split(",")
    if a.rounds < 2 or any(m not in MODES for m in modes):
        ap.error(f"--rounds >= 2; --only from {MODES}")
    try:
        import ray  # noqa: F401
        import vllm  # noqa: F401
    except ImportError as e:
        sys.exit(f"needs the scale venv (make scale-env; .venv-scale/bin/python benchmarks/scale.py): {e}")
    res = {}
    for m in modes:
        print(f"== {m}", flush=True)
        res[m] = measure(m, a.rounds)
        r = res[m]
        extra = f", {r['syncs']:.0f} syncs, {r['sync_ms']:.0f} ms per sync" if "sync_ms" in r else ""
        print(f"{m}: {r['tokens']:.0f} tokens in {r['seconds']:.1f} s = {r['tok_s']:.1f} tok/s{extra} "
              f"(start-up {r['start_s']:.0f} s)", flush=True)
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
    if base and "vllm" in res:
        figures["inproc_vs_vllm_32"] = base["tok_s"] / res["vllm"]["tok_s"]
    if a.alone and "in-process" in modes and "vllm" in modes:  # one dialogue: the engines' latency, not batching
        alone = {}
        for m in ("in-process", "vllm"):
            print(f"== {m}, one dialogue", flush=True)
            alone[m] = measure(m, a.rounds, dialogues=1)
            print(f"{m} alone: {alone[m]['tokens']:.0f} tokens in {alone[m]['seconds']:.1f} s = "
                  f"{alone[m]['tok_s']:.1f} tok/s", flush=True)
        figures["inproc_vs_vllm_1"] = alone["in-process"]["tok_s"] / alone["vllm"]["tok_s"]
        print(f"in-process / vLLM tokens/s: {figures.get('inproc_vs_vllm_32', float('nan')):.2f}x at 32 dialogues, "
              f"{figures['inproc_vs_vllm_1']:.2f}x alone")
    report("scale", **figures)


if __name__ == "__main__":
    main()
