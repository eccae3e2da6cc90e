"""scope's GRPO step beside TRL's GRPOTrainer on the same workload, alternating the two so that the machine's
drift falls on both. Goal: scope's step <= 0.6x TRL's.

The workload: P4G with the embedded SmolLM2-135M-Instruct, P=4 tasks x G=4, one agent
turn of at most 48 tokens and one frozen persuadee turn of at most 16 after the forced ``[DONATE $`` start,
temperature 0.7 for both, LoRA r 16 (alpha 32) on every linear layer, lr 2e-5, KL 0.005 to the base, clip
0.2 / 0.28, float32, 2 torch threads, one update per step. scope runs ``scope train`` (its step time from
metrics.jsonl); TRL runs benchmarks/peers/trl_grpo.py in the peers venv (``make peers-env``). Each run's first
step is left out (loading, first allocations).

    python benchmarks/peers/grpo_step.py [--steps 3] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from report import report  # noqa: E402 - benchmarks/report.py

PEERS = os.path.join(ROOT, ".venv-peers", "bin", "python")
P, G, AGENT_TOKENS, PARTNER_TOKENS, T, LR, KL, CLIP, R, ALPHA, THREADS = 4, 4, 48, 16, 0.7, 2e-5, 0.005, \
    (0.2, 0.28), 16, 32, 2


def workload(d: str, steps: int, seed: int) -> str:
    """The prompts scope's environment gives the agent and the persuadee (the pitch left as a placeholder),
    and the settings, for TRL's side."""
    from scope.envs.base import get_env
    from scope.models.loading import materialize_embedded

    cls = get_env("p4g")
    tasks = cls.load_tasks("train", personas="builtin")[:P]
    agent, partner = [], []
    for t in tasks:
        e = cls(t, random.Random(0), max_turns=1, force_decision=True)
        agent.append([dict(m) for m in e.views["agent"]])
        e.on_reply("agent", "<<PITCH>>")
        partner.append([dict(m) for m in e.views["partner"]])
        prefix = e.reply_prefix("partner")
    w = {"model": materialize_embedded("smollm2-135m"), "agent_prompts": agent, "partner_views": partner,
         "prefix": prefix, "group": G, "agent_tokens": AGENT_TOKENS, "partner_tokens": PARTNER_TOKENS,
         "temperature": T, "lr": LR, "kl": KL, "clip": list(CLIP), "lora_r": R, "lora_alpha": ALPHA,
         "threads": THREADS, "steps": steps, "seed": seed, "out": os.path.join(d, "trl")}
    path = os.path.join(d, "workload.json")
    json.dump(w, open(path, "w"))
    return path


def scope_config(d: str, steps: int, seed: int) -> str:
    cfg = {"run": {"dir": os.path.join(d, "scope"), "seed": seed, "save_every": 10 ** 6, "progress": False,
                   "report_to": [], "threads": THREADS, "save_rollouts": False},
           "models": {"policy": {"path": "smollm2-135m", "finetune": "lora",
                                 "lora": {"r": R, "alpha": ALPHA, "target_modules": "all-linear"}}},
           "agent": {"model": "policy", "trainable": True, "temperature": T, "max_new_tokens": AGENT_TOKENS},
           "partner": {"model": "policy", "temperature": T, "max_new_tokens": PARTNER_TOKENS},
           "env": {"name": "p4g", "options": {"max_turns": 1, "force_decision": True, "personas": "builtin"}},
           "rollout": {"n_tasks": P, "group_size": G, "end_on_truncation": False},
           "train": {"steps": steps, "lr": LR, "kl_coef": KL, "eps_low": CLIP[0], "eps_high": CLIP[1]},
           "eval": {"panel": None}}
    path = os.path.join(d, "scope.json")
    json.dump(cfg, open(path, "w"))
    return path


def run_scope(d: str, steps: int, seed: int) -> list[float]:
    subprocess.run([sys.executable, "-m", "scope.cli", "train", "--config", scope_config(d, steps, seed)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(os.path.join(d, "scope", "metrics.jsonl"))]
    return [r["step_seconds"] for r in rows if "step_seconds" in r]


def run_trl(d: str, steps: int, seed: int) -> list[float]:
    out = subprocess.run([PEERS, os.path.join(HERE, "trl_grpo.py"), workload(d, steps, seed)], check=True,
                         stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["step_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="steps per run (the first is left out)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each, alternating scope and TRL")
    a = ap.parse_args()
    if not os.path.exists(PEERS):
        sys.exit(f"grpo_step: {PEERS} is missing; `make peers-env` builds it")
    got: dict[str, list[float]] = {"scope": [], "trl": []}
    for k in range(a.rounds):
        order = ("scope", "trl") if k % 2 == 0 else ("trl", "scope")
        for who in order:
            with tempfile.TemporaryDirectory() as d:
                secs = (run_scope if who == "scope" else run_trl)(d, a.steps, k)
            print(f"round {k + 1}, {who}: steps {', '.join(f'{s:.1f}' for s in secs)} s", file=sys.stderr, flush=True)
            got[who] += secs[1:]
    mean = {k: sum(v) / len(v) for k, v in got.items()}
    print(f"\n| GRPO step, P4G {P} tasks x G={G}, {AGENT_TOKENS}+{PARTNER_TOKENS} tokens, LoRA r {R} | "
          "seconds (mean) | steps timed |\n|---|---|---|")
    for k, v in got.items():
        name = "scope" if k == "scope" else "TRL GRPOTrainer"
        print(f"| {name} | {mean[k]:.1f} | {len(v)} ({', '.join(f'{s:.1f}' for s in v)}) |")
    ratio = mean["scope"] / mean["trl"]
    print(f"\nscope / TRL step time: {ratio:.2f}x (goal <= 0.6x)")
    report("peers_grpo_step", scope_step_s=mean["scope"], trl_step_s=mean["trl"], ratio=ratio)


if __name__ == "__main__":
    main()
