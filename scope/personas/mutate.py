"""Mutators of persona generators.

- ``StructuralMutator``: the structural operators of ``genome.py`` only (no model).
- ``ModelMutator``: a structural change, then a model (any model reference the project has: the
  embedded model, a local checkpoint, an OpenAI-compatible endpoint) rewrites one text field of the
  child: an axis's on/off instruction or the population text. The reply is text put into that field,
  never executed; an empty, over-long or off-task reply (one that speaks of markers, tools or the
  donation format) is refused, counted, and the child keeps its structural change only.
"""
from __future__ import annotations

import copy
import random
import re
from typing import Any

from .genome import MAX_TEXT, Genome, check, mutate_structure

REWRITE_PROMPT = (
    "You write short role-play instructions for people in a chat study. Rewrite the instruction below so "
    "that it describes a different but realistic way a person could behave, in one sentence addressed to "
    "the person as 'You'. Reply with the new sentence only.\n\nWhat it is about: {definition}\n"
    "Instruction: {text}")
POPULATION_PROMPT = (
    "Describe, in one sentence addressed to the person as 'You', a realistic kind of adult who might chat "
    "online after finishing a short paid task. Different from: {text}\nReply with the sentence only.")
_BANNED = re.compile(r"(\[DONATE|<tool|\{|\}|###)", re.IGNORECASE)


def clean_reply(text: str) -> str | None:
    """The first non-empty line of a model's reply, or None if it cannot be a field's text."""
    line = next((ln.strip().strip('"').strip() for ln in (text or "").splitlines() if ln.strip()), "")
    line = re.sub(r"^(new instruction|instruction|sentence)\s*:\s*", "", line, flags=re.IGNORECASE).strip().strip('"')
    if len(line) < 12 or len(line) > MAX_TEXT or _BANNED.search(line) or not any(c.isalpha() for c in line):
        return None
    return line


class StructuralMutator:
    def __init__(self):
        self.stats = {"structural": 0}

    def __call__(self, pairs: list[tuple[Genome, Genome | None]], rng: random.Random) -> list[Genome]:
        self.stats["structural"] += len(pairs)
        return [mutate_structure(p, rng, o) for p, o in pairs]


class ModelMutator(StructuralMutator):
    def __init__(self, binding: Any, rewrite_prob: float = 0.7):
        super().__init__()
        self.binding, self.rewrite_prob = binding, rewrite_prob
        self.stats.update(rewrites=0, refused=0, failed=0)

    def __call__(self, pairs: list[tuple[Genome, Genome | None]], rng: random.Random) -> list[Genome]:
        from ..rollout import chat_complete

        children = super().__call__(pairs, rng)
        asks: list[str] = []
        where: list[tuple[int, int | None, str]] = []
        for i, c in enumerate(children):
            if rng.random() >= self.rewrite_prob:
                continue
            if rng.random() < 0.2:
                asks.append(POPULATION_PROMPT.format(text=c.population))
                where.append((i, None, "population"))
            else:
                ai = rng.randrange(len(c.axes))
                a = c.axes[ai]
                key = "on" if not a.off or rng.random() < 0.6 else "off"
                asks.append(REWRITE_PROMPT.format(definition=a.definition, text=getattr(a, key)))
                where.append((i, ai, key))
        if not asks:
            return children
        outs = chat_complete(self.binding.ref, [[{"role": "user", "content": q}] for q in asks], self.binding.sampling)
        for (i, j, key), out in zip(where, outs):
            if isinstance(out, BaseException):
                self.stats["failed"] += 1
                continue
            text = clean_reply(out.text)
            if text is None:
                self.stats["refused"] += 1
                continue
            c = copy.deepcopy(children[i])
            if j is None:
                c.population = text
            else:
                setattr(c.axes[j], key, text)
            try:
                check(c)
            except ValueError:
                self.stats["refused"] += 1
                continue
            c.ops = children[i].ops + [f"rewrite:{'population' if j is None else c.axes[j].name + '.' + key}"]
            children[i] = c
            self.stats["rewrites"] += 1
        return children


EXPAND_PROMPT = (
    "Turn these role-play instructions into a short character description of one person, addressed to "
    "them as 'You', two sentences at most, keeping every instruction. Reply with the description only.\n\n"
    "Instructions: {text}")


def expand_with_model(personas: list[dict[str, Any]], binding: Any, stats: dict[str, int] | None = None
                      ) -> list[dict[str, Any]]:
    """Role-play expansion through a model: each persona's assembled instructions rewritten as a short
    character description (``text``; the template's text is kept in ``template_text``). A failed or
    refused reply keeps the template's text, counted in ``stats``."""
    from ..rollout import chat_complete

    stats = stats if stats is not None else {}
    outs = chat_complete(binding.ref, [[{"role": "user", "content": EXPAND_PROMPT.format(text=p["text"])}]
                                       for p in personas], binding.sampling)
    res = []
    for p, out in zip(personas, outs):
        text = None if isinstance(out, BaseException) else clean_reply(out.text)
        key = "expanded" if text else ("expand_failed" if isinstance(out, BaseException) else "expand_refused")
        stats[key] = stats.get(key, 0) + 1
        res.append(dict(p, text=text or p["text"], template_text=p["text"]))
    return res
