"""Tokens/s of the batched rollout engine on the embedded model, against one dialogue at a time.

P4G dialogues between a LoRA agent and the frozen base as partner (one base in memory), 3 agent
turns, up to 48 new tokens per reply. Prints tokens/s with 8 and 16 concurrent dialogues, then
measures 32 concurrent dialogues against the same 32 dialogues run one at a time, side by side:
in each of ``--rounds`` rounds the 32 run together once, then a 1/rounds share of them runs one at a
time. A 2-core machine's speed drifts by 10-25% over minutes; alternating the two spreads that drift
over both figures instead of letting it fall on one. The last line is the ratio at 32 dialogues
(all batched tokens over all batched seconds, against the same for the dialogues run alone).

    python benchmarks/rollout_throughput.py [--turns 3] [--max-new-tokens 48] [--rounds 4] [--batched-only]

``--batched-only``: only the 32 dialogues together, ``--rounds`` times (benchmarks/allocators.py ``--rollout``
compares allocators on it); its last line is their tokens/s.
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from scope.envs.base import get_env
from scope.models.backend import ModelRef
from scope.models.loading import load_backend
from scope.rollout import Job, run_rollouts
from scope.types import Episode, SamplingParams
from report import report  # benchmarks/report.py (a script's own directory is on sys.path)


def jobs(refs, n, turns, offset=0):
    env_cls = get_env("p4g")
    tasks = env_cls.load_tasks("train")
    out = []
    for i in range(offset, offset + n):
        t = tasks[i % len(tasks)]
        out.append(Job(env=env_cls(t, random.Random(i), max_turns=turns), episode=Episode(t.id, str(i), 0),
                       bindings=dict(refs), uid=i))
    return out


def timed(refs, sp, n, turns, offset=0) -> tuple[int, float]:
    t = time.time()
    _, st = run_rollouts(jobs(refs, n, turns, offset), sp, end_on_truncation=False)
    return st.tokens_generated, time.time() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=4, help="rounds of (32 together, 32/rounds one at a time)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batched-only", action="store_true", help="only the 32 dialogues together, --rounds times")
    a = ap.parse_args()
    if a.rounds < 1 or 32 % a.rounds:
        ap.error("--rounds must divide 32")
    torch.set_num_threads(a.threads)
    b = load_backend("smollm2-135m", seed=0)
    b.add_lora("agent")
    refs = {"agent": ModelRef("smollm2:agent", b, "agent", True), "partner": ModelRef("smollm2:base", b)}
    sp = {r: SamplingParams(temperature=0.7, max_new_tokens=a.max_new_tokens) for r in refs}
    run_rollouts(jobs(refs, 2, 1), sp, end_on_truncation=False)  # warm-up
    print(f"{'dialogues':>12} {'tokens':>8} {'seconds':>8} {'tokens/s':>9}")
    if a.batched_only:
        bt = bs = 0.0
        for r in range(a.rounds):
            tok, dt = timed(refs, sp, 32, a.turns, offset=32 * r)
            bt, bs = bt + tok, bs + dt
            print(f"{'32':>12} {tok:>8} {dt:>8.1f} {tok / dt:>9.1f}   (round {r + 1}/{a.rounds})", flush=True)
        print(f"batched tokens/s: {bt / bs:.2f}")
        return
    for n in (8, 16):
        tok, dt = timed(refs, sp, n, a.turns)
        print(f"{n:>12} {tok:>8} {dt:>8.1f} {tok / dt:>9.1f}", flush=True)
    per = 32 // a.rounds
    bt = bs = st = ss = 0.0
    for r in range(a.rounds):
        tok, dt = timed(refs, sp, 32, a.turns)
        bt, bs = bt + tok, bs + dt
        print(f"{'32':>12} {tok:>8} {dt:>8.1f} {tok / dt:>9.1f}   (round {r + 1}/{a.rounds})", flush=True)
        tok = dt = 0.0
        for i in range(r * per, (r + 1) * per):
            t1, d1 = timed(refs, sp, 1, a.turns, offset=i)
            tok, dt = tok + t1, dt + d1
        st, ss = st + tok, ss + dt
        print(f"{'1 at a time':>12} {int(tok):>8} {dt:>8.1f} {tok / dt:>9.1f}   "
              f"(dialogues {r * per}-{(r + 1) * per - 1})", flush=True)
    print(f"{'32':>12} {int(bt):>8} {bs:>8.1f} {bt / bs:>9.1f}   (all rounds)")
    print(f"{'1 at a time':>12} {int(st):>8} {ss:>8.1f} {st / ss:>9.1f}   (the same 32 dialogues, in sequence)")
    print(f"ratio at 32 dialogues (batched / one at a time): {(bt / bs) / (st / ss):.2f}x")
    report("rollout_throughput", ratio_32=(bt / bs) / (st / ss), batched_tok_s=bt / bs, single_tok_s=st / ss)


if __name__ == "__main__":
    main()
