"""What each arm's agent says at the end of a grid's training, and what the simulators answer
(``dialogues.md``)."""
from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any


def dialogue_cards(out: str, labels: dict[str, str], env_cls: Any = None, examples: int = 2) -> str:
    """What each arm's agent says at its last evaluation (seed 0), and what the simulators answer: per arm, its
    most frequent opening, what the environment reads from its episodes (``Env.card_lines``), the reward per
    simulator, and a few whole dialogues (with the first seen and the first unseen simulator)."""
    lines = ["# What the agents say at the end of training (seed 0, the last evaluation)", ""]
    for arm, label in labels.items():
        d = os.path.join(out, arm, "seed0", "eval")
        steps = sorted(os.listdir(d)) if os.path.isdir(d) else []
        if not steps:
            continue
        with open(os.path.join(d, steps[-1], "eval_episodes.jsonl")) as f:
            eps = [json.loads(x) for x in f if x.strip()]
        opens = Counter(next((m["content"] for m in e["messages"] if m["role"] == "agent"), "") for e in eps)
        lines += [f"## {label} ({steps[-1].replace('_', ' ')})", "",
                  f"- most frequent opening ({opens.most_common(1)[0][1]} of {len(eps)} dialogues): "
                  f"\"{opens.most_common(1)[0][0][:200]}\"" if opens else "- no dialogue"]
        if env_cls is not None:
            lines += env_cls.card_lines(eps)
        by: dict[str, list[dict]] = {}
        for e in eps:
            by.setdefault(e["meta"].get("partner", "?"), []).append(e)
        lines.append("- reward per simulator: " + ", ".join(
            f"{k} {sum(x['rewards'].get('agent', 0.0) for x in v) / len(v):.3f}" for k, v in by.items()))
        lines.append("")
        shown = list(by)[:1] + [k for k in by if k not in list(by)[:3]][:1]
        for k in shown:
            for e in by[k][:examples]:
                lines.append(f"**with {k}** (reward {e['rewards'].get('agent', 0.0):.2f}):")
                lines += [f"> {m['role']}: {m['content'][:300]}" for m in e["messages"]]
                lines.append("")
    return "\n".join(lines) + "\n"
