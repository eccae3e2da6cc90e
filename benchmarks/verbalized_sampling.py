"""Rollout wall time with a Verbalized Sampling partner vs a plain partner, on the embedded model.

16 P4G dialogues, 2 agent turns; the agent is a LoRA policy, the partner the frozen base. The VS
partner asks for k=5 candidates (up to --vs-tokens new tokens, up to 2 re-asks, then a plain reply;
tokens counted include those of discarded attempts).
Prints each wall time, the VS parse outcome, and on its last line the ratio VS / plain.

    python benchmarks/verbalized_sampling.py [--dialogues 16] [--turns 2] [--vs-tokens 256]
"""
from __future__ import annotations

import argparse
import random
import time
from collections import Counter

import torch

from scope.config import VSConfig
from scope.envs.base import get_env
from scope.models.backend import ModelRef
from scope.models.loading import load_backend
from scope.partners.binding import Binding
from scope.rollout import Job, run_rollouts
from scope.types import Episode, SamplingParams
from report import report  # benchmarks/report.py (a script's own directory is on sys.path)


def run(refs, n, turns):
    env_cls = get_env("p4g")
    tasks = env_cls.load_tasks("train")
    jobs = [Job(env=env_cls(tasks[i % len(tasks)], random.Random(i), max_turns=turns),
                episode=Episode(tasks[i % len(tasks)].id, str(i), 0), bindings=dict(refs), uid=i) for i in range(n)]
    t = time.time()
    eps, st = run_rollouts(jobs, end_on_truncation=False)
    return time.time() - t, eps, st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dialogues", type=int, default=16)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--vs-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(2)
    b = load_backend("smollm2-135m", seed=0)
    b.add_lora("agent")
    sp = SamplingParams(temperature=0.7, max_new_tokens=a.max_new_tokens)
    agent = Binding("agent", ModelRef("smollm2:agent", b, "agent", True), sp)
    base = ModelRef("smollm2:base", b)
    plain = {"agent": agent, "partner": Binding("plain", base, sp)}
    vs = {"agent": agent, "partner": Binding("vs", base, sp, vs=VSConfig(k=a.k, max_new_tokens=a.vs_tokens))}
    run(plain, 2, 1)  # warm-up
    t_plain, _, st_p = run(plain, a.dialogues, a.turns)
    print(f"plain partner: {t_plain:.1f}s, {st_p.tokens_generated} tokens", flush=True)
    t_vs, eps, st_v = run(vs, a.dialogues, a.turns)
    recs = [r for e in eps for r in e.vs]
    parsed = sum(not r["fallback"] for r in recs)
    reasks = sum(r["attempts"] - 1 for r in recs)
    restarts = sum(e.startswith("runaway") for r in recs for e in r["errors"])
    print(f"VS partner (k={a.k}): {t_vs:.1f}s, {st_v.tokens_generated} tokens; {len(recs)} partner turns, "
          f"{parsed} parsed, {len(recs) - parsed} fell back to plain, {reasks} re-asks "
          f"({restarts} of them runaways restarted inside the batch)")
    causes = Counter(e.split(":")[0].split(" (")[0] for r in recs for e in r["errors"])
    if causes:
        print("why attempts were discarded: " + ", ".join(f"{k}: {v}" for k, v in causes.most_common()))
    sizes = sorted(Counter(len(r["candidates"]) for r in recs if not r["fallback"]).items())
    print("candidates per parsed VS turn: " + ", ".join(f"{k}: {v} turns" for k, v in sizes))
    print(f"rollout wall-time ratio VS / plain: {t_vs / t_plain:.2f}x")
    report("verbalized_sampling", ratio=t_vs / t_plain, parsed_frac=parsed / max(len(recs), 1), reasks=reasks,
           fallbacks=len(recs) - parsed)


if __name__ == "__main__":
    main()
