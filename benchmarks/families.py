"""The two embedded families side by side: SmolLM2-135M-Instruct and Gemma 3 270M base, on the same work.

- **Decode**: tokens/s of the rollout engine's batched sampling, 16 rows of a P4G-pitch-sized prompt (system
  text, a pitch, the decision note), 32 new tokens each, each model in its own transcript format.
- **Update**: seconds per trained token of one LoRA update (r 16, every layer) on 16 traces of the same prompts
  with 32 trained tokens each, the learner's chunked log-probs (Gemma's 262,144-word output layer against
  SmolLM2's 49,152).

The two models alternate ``--rounds`` times (a 2-core machine drifts by 10-25% over minutes; alternating spreads
the drift over both), and the last lines are the ratios Gemma / SmolLM2.

    python benchmarks/families.py [--rounds 3] [--rows 16] [--new-tokens 32] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from scope.learner import Learner, LearnerConfig
from scope.models.loading import load_backend
from scope.rollout import encode, render
from scope.types import SamplingParams, Trace
from report import report  # benchmarks/report.py (a script's own directory is on sys.path)

PITCH = ("Hi! Children in war zones need schools and safety. Save the Children is there. Could you give some of "
         "your $2 to help a child today?")
SYSTEM = ("You are a person chatting online. You just earned $2 for a task. A stranger writes to you. Reply "
          "briefly, in one sentence.\nYou are {age} years old, female, married, income bracket 5 of 12. Your "
          "personality: very high agreeableness and low neuroticism.")


def prompts(tok, rows: int) -> list[list[int]]:
    return [encode(tok, render(tok, [{"role": "system", "content": SYSTEM.format(age=20 + i)},
                                     {"role": "user", "content": PITCH}], True)) for i in range(rows)]


def decode_rate(b, ps, new: int) -> float:
    sp = SamplingParams(temperature=1.0, max_new_tokens=new)
    t0 = time.time()
    outs = b.generate(ps, sp)
    return sum(len(o.token_ids) for o in outs) / (time.time() - t0)


def update_cost(b, learner, ps, new: int) -> float:
    g = torch.Generator().manual_seed(0)
    traces, advs = [], []
    for i, p in enumerate(ps):
        t = Trace(role="agent")
        t.extend_context(p)
        ids = torch.randint(10, 2000, (new,), generator=g).tolist()
        t.extend_generated(ids, [-1.0] * new, ("m", 0))
        traces.append(t)
        advs.append(1.0 if i % 2 else -1.0)
    t0 = time.time()
    learner.update(traces, advs)
    return (time.time() - t0) / (len(ps) * new)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    models = {}
    for name in ("smollm2-135m", "gemma3-270m"):
        b = load_backend(name, seed=0)
        b.add_lora("agent", r=16, alpha=32)
        learner = Learner(b, "agent", LearnerConfig(lr=1e-5, kl_coef=0.0))
        ps = prompts(b.tokenizer, a.rows)
        models[name] = (b, learner, ps)
        print(f"{name}: {sum(p.numel() for p in b.model.parameters()) / 1e6:.0f}M parameters, vocabulary "
              f"{b.model.get_output_embeddings().weight.shape[0]}, prompt {len(ps[0])} tokens", flush=True)
    rates: dict[str, list[float]] = {n: [] for n in models}
    costs: dict[str, list[float]] = {n: [] for n in models}
    for r in range(a.rounds):
        for name, (b, learner, ps) in models.items():
            rates[name].append(decode_rate(b, ps, a.new_tokens))
            costs[name].append(update_cost(b, learner, ps, a.new_tokens))
            print(f"round {r + 1}: {name}: decode {rates[name][-1]:.0f} tokens/s, update "
                  f"{costs[name][-1] * 1e3:.2f} ms per trained token", flush=True)
    med = {n: (statistics.median(rates[n]), statistics.median(costs[n])) for n in models}
    for n, (rate, cost) in med.items():
        print(f"{n}: decode {rate:.0f} tokens/s (median of {a.rounds}), update {cost * 1e3:.2f} ms per trained token")
    s, g = med["smollm2-135m"], med["gemma3-270m"]
    print(f"gemma3-270m / smollm2-135m: decode {g[0] / s[0]:.2f}x the tokens/s, update {g[1] / s[1]:.2f}x the time "
          f"per trained token")
    report("families", smollm2_decode_tok_s=s[0], gemma3_decode_tok_s=g[0], smollm2_update_ms_per_token=s[1] * 1e3,
           gemma3_update_ms_per_token=g[1] * 1e3, decode_ratio=g[0] / s[0], update_ratio=g[1] / s[1])


if __name__ == "__main__":
    main()
