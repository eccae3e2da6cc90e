"""A panel's decision readouts on one base model: the layers below the simulators' adapters run once or once
per simulator.

P4G-pitch's panel reads every pitch under the base model at two temperatures and under four simulators
whose LoRA adapters change only the top 8 of the 30 layers. This script builds that on the embedded
SmolLM2-135M (four fresh top-8 adapters with random weights: no fitted simulator needed), reads 96 prompts of
about 150 tokens under the six members in the panel's order, once with each member running the whole
decoder and once with the states below the adapters shared (``scope.models.readout.Shared``), and prints
the seconds per member side by side, the ratio, and whether every distribution and drawn reply is the same
to the bit.

    python benchmarks/panel_readout.py [--prompts 96]
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from scope.envs.p4g_pitch import AMOUNT, P4GPitch
from scope.models.loading import load_backend
from scope.rollout import encode, render
from scope.types import SamplingParams, Task
from report import report  # benchmarks/report.py (a script's own directory is on sys.path)

PERSONA = {"user_id": "u1", "age": 34, "sex": "Female", "marital": "Married", "religion": "Catholic",
           "ideology": "Liberal", "income": 5, "extrovert": 2.0, "agreeable": 4.8, "conscientious": 3.2,
           "neurotic": 1.2, "open": 3.0}
PITCHES = ["Dear friend, a gift of $2 today feeds a child for a week at Save the Children.",
           "Every dollar you give to Save the Children reaches a child who needs it. Will you give $1?",
           "I hope this message finds you well. We are thrilled to announce a donation drive for children."]


def prompts(tok, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        env = P4GPitch(Task(f"t{i}", "test", dict(PERSONA, age=20 + i % 50, income=1 + i % 12)), random.Random(i))
        env.on_reply("agent", PITCHES[i % 3] + f" (note {i})")
        out.append(encode(tok, render(tok, env.views["partner"], True) + "[DONATE $"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=96)
    a = ap.parse_args()
    torch.set_num_threads(2)
    b = load_backend("smollm2-135m", seed=0)
    g = torch.Generator().manual_seed(0)
    for k in range(1, 5):
        b.add_lora(f"p{k}", top_layers=8)
    with torch.no_grad():
        for name, p in b.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    ps = prompts(b.tokenizer, a.prompts)
    members = [("T0", None, 0.7), ("P1", "p1", 0.7), ("P2", "p2", 0.7), ("P3", "p3", 0.7), ("P4", "p4", 0.7),
               ("base-T1.0", None, 1.0)]
    secs, outs = {}, {}
    for share in (False, True):
        b.share_readouts, b._shared = share, None  # a fresh Shared for the shared pass
        b.generator.manual_seed(0)
        secs[share], outs[share] = [], []
        for _, adapter, temp in members:
            t = time.perf_counter()
            outs[share].append(b.readout(ps, SamplingParams(temperature=temp, max_new_tokens=16), AMOUNT,
                                         adapter=adapter))
            secs[share].append(time.perf_counter() - t)
    same = all(r.dist == q.dist and r.completion.token_ids == q.completion.token_ids
               for rs, qs in zip(outs[False], outs[True]) for r, q in zip(rs, qs))
    print(f"{len(ps)} prompts of {sum(map(len, ps)) / len(ps):.0f} tokens; seconds per member (each alone, shared)")
    for (name, _, _), x, y in zip(members, secs[False], secs[True]):
        print(f"  {name:>10}: {x:6.1f}  {y:6.1f}")
    whole, shared = sum(secs[False]), sum(secs[True])
    print(f"  {'panel':>10}: {whole:6.1f}  {shared:6.1f}  -> {whole / shared:.2f}x; the same to the bit: {same}")
    report("panel_readout", alone_s=whole, shared_s=shared, ratio=whole / shared, identical=float(same))


if __name__ == "__main__":
    main()
