"""What each paradigm's agent says at the end of a grid's training, and what the simulators answer
(``dialogues.md``)."""
from __future__ import annotations

import json
import os
import re
from collections import Counter


def dialogue_cards(out: str, paradigms: list[str], labels: dict[str, str], examples: int = 2) -> str:
    """What each paradigm's agent says at its last evaluation (seed 0), and what the simulators answer: per
    paradigm, its most frequent opening, how often it names a dollar amount, the reward per simulator, and a
    few whole dialogues (with the first seen and the first unseen simulator)."""

    lines = ["# What the agents say at the end of training (seed 0, the last evaluation)", ""]
    for p in paradigms:
        d = os.path.join(out, p, "seed0", "eval")
        steps = sorted(os.listdir(d)) if os.path.isdir(d) else []
        if not steps:
            continue
        with open(os.path.join(d, steps[-1], "eval_episodes.jsonl")) as f:
            eps = [json.loads(x) for x in f if x.strip()]
        opens = Counter(next((m["content"] for m in e["messages"] if m["role"] == "agent"), "") for e in eps)
        agent_turns = [m["content"] for e in eps for m in e["messages"] if m["role"] == "agent"]
        dollars = sum(bool(re.search(r"\$\s*\d", t)) for t in agent_turns) / max(len(agent_turns), 1)
        lines += [f"## {labels[p]} ({steps[-1].replace('_', ' ')})", "",
                  f"- most frequent opening ({opens.most_common(1)[0][1]} of {len(eps)} dialogues): "
                  f"\"{opens.most_common(1)[0][0][:200]}\"" if opens else "- no dialogue",
                  f"- agent turns that name a dollar amount: {dollars:.2f}"]
        if any("persona" in e["meta"] for e in eps):  # Persuasion for Good's episodes
            lines += p4g_lines(eps, agent_turns)
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


def p4g_lines(eps: list[dict], agent_turns: list[str]) -> list[str]:
    """Persuasion for Good: what the persuadees decided (no amount stated counts as no gift) and how often the
    persuader still talks about the cause."""
    gifts = Counter("none stated" if e["meta"].get("donation") is None else f"${e['meta']['donation']:g}" for e in eps)
    cause = sum(bool(re.search(r"charit|children|donat|save the", t, re.IGNORECASE)) for t in agent_turns)
    return ["- persuadees' decisions: " + ", ".join(f"{k} {v}" for k, v in gifts.most_common(6)) + f" (of {len(eps)})",
            f"- agent turns that mention the charity, children or donating: {cause / max(len(agent_turns), 1):.2f}"]
