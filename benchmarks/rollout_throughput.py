"""Tokens/s of the batched rollout engine on the embedded model, against one dialogue at a time.

P4G dialogues between a LoRA agent and the frozen base as partner (one base in memory), 3 agent
turns, up to 48 new tokens per reply. Prints tokens/s with 8, 16 and 32 concurrent dialogues, then
the same 32 dialogues run one at a time; the last line is the ratio at 32.

    python benchmarks/rollout_throughput.py [--turns 3] [--max-new-tokens 48] [--sequential 32]
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from scope.envs import get_env
from scope.models.local import ModelRef, load_backend
from scope.rollout import Job, run_rollouts
from scope.types import Episode, SamplingParams


def jobs(refs, n, turns, offset=0):
    env_cls = get_env("p4g")
    tasks = env_cls.load_tasks("train")
    out = []
    for i in range(offset, offset + n):
        t = tasks[i % len(tasks)]
        out.append(Job(env=env_cls(t, random.Random(i), max_turns=turns), episode=Episode(t.id, str(i), 0),
                       refs=dict(refs), uid=i))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--sequential", type=int, default=32, help="how many of the 32 dialogues to run one at a time")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    b = load_backend("smollm2-135m", seed=0)
    b.add_lora("agent")
    refs = {"agent": ModelRef("smollm2:agent", b, "agent", True), "partner": ModelRef("smollm2:base", b)}
    sp = {r: SamplingParams(temperature=0.7, max_new_tokens=a.max_new_tokens) for r in refs}
    run_rollouts(jobs(refs, 2, 1), sp, end_on_truncation=False)  # warm-up
    print(f"{'dialogues':>10} {'tokens':>8} {'seconds':>8} {'tokens/s':>9}")
    rates = {}
    for n in (8, 16, 32):
        t = time.time()
        _, st = run_rollouts(jobs(refs, n, a.turns), sp, end_on_truncation=False)
        dt = time.time() - t
        rates[n] = st.tokens_generated / dt
        print(f"{n:>10} {st.tokens_generated:>8} {dt:>8.1f} {rates[n]:>9.1f}", flush=True)
    tok, t = 0, time.time()
    for i in range(a.sequential):
        _, st = run_rollouts(jobs(refs, 1, a.turns, offset=i), sp, end_on_truncation=False)
        tok += st.tokens_generated
    dt = time.time() - t
    seq = tok / dt
    print(f"{'1 at a time':>10} {tok:>8} {dt:>8.1f} {seq:>9.1f}   ({a.sequential} dialogues in sequence)")
    print(f"ratio at 32 dialogues (batched / one at a time): {rates[32] / seq:.2f}x")


if __name__ == "__main__":
    main()
