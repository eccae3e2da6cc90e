"""Co-Training and Population Co-Training against RL (Single), same config and model.

Each mode trains the embedded model for a few steps in its own process (so peak memory is its own):
- single:     LoRA agent vs the frozen base as partner
- cotrain:    the partner trains too (its own LoRA adapter on the same base)
- population: as cotrain, partner drawn from a FIFO pool (K=5, a snapshot every step, so the pool
              is full from step 4 on)
Prints mean step time after the first step, peak RSS, the step-time ratio cotrain / single, the
peak-memory ratio population / single (goal <= 1.15x), each mode's resident set after every step and
its slope (goal: flat) and the time to switch pool members (goal <= 50 ms).

    python benchmarks/population.py [--steps 5]     (--steps 20 for the slope over 20 steps)
    python benchmarks/population.py --steps 20 --modes single,population   (the 20-step peak ratio, goal
                                                                          <= 1.10x, and the slope)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from report import report, rss_mb  # benchmarks/report.py (a script's own directory is on sys.path)


def config(mode: str, run_dir: str, steps: int) -> dict:
    partner = {"model": "policy", "max_new_tokens": 32}
    if mode in ("cotrain", "population"):
        partner.update(trainable=True, reward="curriculum")
    if mode == "population":
        partner.update(source="pool", pool={"size": 5, "every": 1}, group_shared=False)
    return {"run": {"dir": run_dir, "save_every": 1000, "progress": False, "save_rollouts": False},
            "models": {"policy": {"path": "smollm2-135m"}},
            "agent": {"model": "policy", "trainable": True, "max_new_tokens": 32},
            "partner": partner,
            "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
            "rollout": {"n_tasks": 4, "group_size": 4, "end_on_truncation": False},
            "train": {"steps": steps, "lr": 2e-5}}


def child(mode: str, steps: int, out: str) -> None:
    import torch

    from scope.config import parse_config
    from scope.run import read_metrics
    from scope.train import train

    torch.set_num_threads(2)
    rss = []  # resident set after each step (MB)

    def sample(step):
        rss.append(rss_mb())
        print(f"  {mode} step {len(rss)}: resident {rss[-1]:.0f} MB", file=sys.stderr, flush=True)  # progress

    with tempfile.TemporaryDirectory() as d:
        train(parse_config(config(mode, os.path.join(d, "run"), steps)), on_step_end=sample, log=lambda s: None)
        ms = read_metrics(os.path.join(d, "run"))
    res = {"mode": mode, "step_seconds": [m["step_seconds"] for m in ms], "rss_mb": rss,
           "rss_slope_mb": slope(rss[1:]),  # from the second step on (the first one allocates the buffers)
           "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    with open(out, "w") as f:
        json.dump(res, f)


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against their index (per step); 0 for fewer than two points."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def switch_time(n: int = 200, backend=None) -> float:
    """Mean seconds to make one of 5 pool members the active adapter (``backend``: the embedded model's)."""
    import torch

    from scope.models.loading import load_backend
    from scope.partners.pool import PoolSource
    from scope.types import SamplingParams

    torch.set_num_threads(2)
    b = backend or load_backend("smollm2-135m")
    b.add_lora("partner")
    pool = PoolSource(b, "partner", SamplingParams(), size=5, every=1)
    for s in range(5):
        pool.snapshot(s)
    x = torch.tensor([[1, 2, 3]])
    t = time.perf_counter()
    for i in range(n):
        with b.using(pool.members[i % 5]):
            pass
    dt = (time.perf_counter() - t) / n
    with torch.no_grad(), b.using(pool.members[0]):  # and the switch really changes the active weights
        b.model(x)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--modes", default="single,cotrain,population",
                    help="comma-separated subset of single,cotrain,population (ratios need their modes)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "OUT"))
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.steps, a.child[1])
        return
    res = {}
    modes = [m for m in ("single", "cotrain", "population") if m in a.modes.split(",")]
    for mode in modes:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--child", mode, out], check=True)
        res[mode] = json.load(open(out))
        os.remove(out)
        st = res[mode]["step_seconds"][1:] or res[mode]["step_seconds"]
        res[mode]["mean_step"] = sum(st) / len(st)
        print(f"{mode:>11}: mean step {res[mode]['mean_step']:.1f}s (steps 2..{a.steps}), "
              f"peak RSS {res[mode]['maxrss_mb']:.0f} MB, resident set after each step "
              f"{' '.join(f'{x / 1024:.2f}' for x in res[mode]['rss_mb'])} GB "
              f"(slope {res[mode]['rss_slope_mb']:+.0f} MB/step from step 2)", flush=True)
    if modes != ["single", "cotrain", "population"]:  # a partial run: no switch time; the 20-step ratio
        if "single" in res and "population" in res:
            ratio = res["population"]["maxrss_mb"] / res["single"]["maxrss_mb"]
            print(f"peak-memory ratio population (K=5) / single: {ratio:.3f}x")
            if a.steps == 20:
                report("population", memory_ratio_20_steps=ratio)
        return
    print(f"step-time ratio cotrain / single: {res['cotrain']['mean_step'] / res['single']['mean_step']:.2f}x")
    print(f"peak-memory ratio population (K=5) / single: "
          f"{res['population']['maxrss_mb'] / res['single']['maxrss_mb']:.3f}x")
    report("population", memory_ratio=res["population"]["maxrss_mb"] / res["single"]["maxrss_mb"],
           cotrain_step_ratio=res["cotrain"]["mean_step"] / res["single"]["mean_step"],
           rss_slope_mb=res["population"]["rss_slope_mb"])  # (before the switch: a failure there keeps these)
    sw = switch_time()
    print(f"pool member switch: {sw * 1e3:.2f} ms (mean of 200 switches among 5 adapters)")
    report("population", switch_ms=sw * 1e3)


if __name__ == "__main__":
    main()
