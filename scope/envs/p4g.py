"""Persuasion for Good: the agent persuades a persuadee (the partner) to donate to Save the Children.

The persuadee plays a persona built from the P4G survey fields. It states a gift as ``[DONATE $N]``;
the episode ends at the first reply with a marker (the last marker of that reply is the gift) or
after ``max_turns`` agent turns. Reward for the agent: min(donation / 2, 1) with the amount clipped
to [0, 2]; no marker gives 0.

Persona sources:
- ``real`` (the paper's configs): the persuadees of the original study (``full_info.csv``, persuadee
  rows, B4 == 1) from ``data_dir`` or ``SCOPE_P4G_DATA``;
- ``builtin``: 36 personas written for this project (``envs/data/p4g_personas.json``), same fields;
- a directory holding the original ``full_info.csv``, or a ``.json`` file of personas.

``continue_after_zero`` (off by default; on in the paper configs, as the paper's release plays it): a
``[DONATE $0]`` does not end the dialogue; the persuader keeps its remaining turns, and a later marker
replaces it (the last marker of the dialogue is the gift).

``force_decision`` (off by default) is for partners too small to use the marker on their own: the
persuadee's reply to the last agent turn is told the chat ends and is started with ``[DONATE $``,
so it must state an amount (the number right after the prefix counts even without the ``]``).

Split: the distinct user ids are sorted, shuffled with ``random.Random(split_seed)`` and the first
``test_fraction`` of them (rounded up) form the test split; the rest are train. A user who appears
in several dialogues stays on one side.
"""
from __future__ import annotations

import os
import random
import re
from typing import Any

from ..data.p4g import (HumanDialogue, load_builtin_personas, load_csv_personas, persona_row, persona_text,
                        resolve_data_dir, split_personas)
from ..types import Task
from .base import Env, register_env

# each run of blanks belongs to exactly one part of the pattern (a blank run before ":" or "$" is tried
# only together with it), so a long run of blanks that ends in no amount fails in linear time
_MARKER = re.compile(r"\[[ \t]*DONATE(?:[ \t]*:)?(?:[ \t]*\$)?[ \t]*(-?\d+(?:\.\d+)?)[ \t]*\]", re.IGNORECASE)
_FORCED = re.compile(r"\[DONATE \$[ \t]*(\d+(?:\.\d+)?)")  # any number of digits: a huge amount clips to $2


def parse_donation(text: str) -> float | None:
    """The amount of the last intact ``[DONATE $N]`` marker in ``text``, clipped to [0, 2], or None.

    The last marker is the decision (a persuadee who corrects herself gives the corrected amount), as
    in the P4G paper's own parsing; words around the marker do not change it ("sure, why not
    [DONATE $1]" gives $1), and amounts in words never count. One regular-expression scan: linear in
    the length of the reply.
    """
    last = None
    for m in _MARKER.finditer(text):
        last = m
    if last is None:
        return None
    return min(max(float(last.group(1)), 0.0), 2.0)


AGENT_PROMPT = (
    "You are a volunteer for the charity Save the Children. You are chatting with a stranger who has just "
    "earned $2 for a task. Persuade them to donate some or all of it to Save the Children, which helps "
    "children in need around the world. Be friendly, honest and brief: one or two sentences per message."
)
# The persona comes last so that every persuadee prompt starts with the same instructions: the
# engine prefills a common prompt prefix once for the whole batch.
PARTNER_PROMPT = (
    "You are a person chatting online. You just earned $2 for a task. The other person may ask you to donate "
    "some of it to a charity. Stay in character and reply briefly, in one or two sentences. "
    "If and when you decide how much to donate, write [DONATE $N] where N is between 0 and 2, and stop. "
    "Only write the marker once you have decided.\n{persona}"
)
OPENING = "[A stranger has joined the chat. You write first.]"
DECISION_NOTE = "[The chat ends now. Decide how much of your $2 to donate, from 0 to 2 dollars.]"
DECISION_PREFIX = "[DONATE $"


@register_env("p4g")
class PersuasionForGood(Env):
    roles = ("agent", "partner")

    def __init__(self, task: Task, rng: random.Random, max_turns: int = 10, agent_prompt: str = AGENT_PROMPT,
                 partner_prompt: str = PARTNER_PROMPT, force_decision: bool = False,
                 continue_after_zero: bool = False, **_: Any):
        super().__init__(task, rng)
        self.max_turns = max_turns
        self.force_decision = force_decision
        self.continue_after_zero = continue_after_zero
        self.donation: float | None = None
        self.views["agent"] = [{"role": "system", "content": agent_prompt},
                               {"role": "user", "content": OPENING}]
        self.views["partner"] = [{"role": "system",
                                  "content": partner_prompt.format(persona=persona_text(task.data))}]
        self.meta["persona"] = task.data.get("user_id")

    def next_role(self) -> str | None:
        if self.done:
            return None
        return "agent" if self.turns["agent"] == self.turns["partner"] else "partner"

    def _deciding(self) -> bool:
        return self.force_decision and self.turns["agent"] >= self.max_turns

    def reply_prefix(self, role: str) -> str:
        return DECISION_PREFIX if role == "partner" and self._deciding() else ""

    def on_reply(self, role: str, text: str) -> None:
        self.turns[role] += 1
        self.say(role, text)
        if role == "agent" and self._deciding():
            # the persuadee's last reply must state a decision: tell it so before it reads this message
            self.views["partner"][-1]["content"] += "\n\n" + DECISION_NOTE
        if role == "partner":
            amount = parse_donation(text)
            if amount is None and self._deciding():
                m = _FORCED.match(text)
                amount = min(max(float(m.group(1)), 0.0), 2.0) if m else None
            if amount is not None:
                self.donation = amount
                self.meta["donation"] = amount
            last_turn = self.turns["agent"] >= self.max_turns
            if amount is not None and (amount > 0 or not self.continue_after_zero or last_turn):
                self.finish("done")
            elif last_turn:
                self.finish("max_turns")

    def rewards(self) -> dict[str, float]:
        r = min((self.donation or 0.0) / 2.0, 1.0)
        return {"agent": r, "partner": r}

    @classmethod
    def card_lines(cls, records: list[dict[str, Any]]) -> list[str]:
        """How often the persuader names a dollar amount and talks about the cause, and what the persuadees
        decided (no amount stated counts as no gift)."""
        return persuasion_lines(records)

    @classmethod
    def load_tasks(cls, split: str, personas: str = "builtin", split_seed: int = 0,
                   test_fraction: float = 0.2, data_dir: str | None = None, **_: Any) -> list[Task]:
        if personas == "real":
            ps = load_csv_personas(resolve_data_dir(data_dir))
        elif personas == "builtin":
            ps = load_builtin_personas()
        elif os.path.isdir(personas):
            ps = load_csv_personas(personas)
        elif personas.endswith(".json"):
            ps = load_builtin_personas(personas)
        else:
            raise ValueError(f"p4g personas: {personas!r} is not 'real', 'builtin', a directory with "
                             f"full_info.csv, or a .json persona file")
        chosen = split_personas(ps, split, seed=split_seed, test_fraction=test_fraction)
        tasks: list[Task] = []
        seen: dict[str, int] = {}
        for p in chosen:
            k = p["user_id"]
            seen[k] = seen.get(k, 0) + 1
            tid = k if seen[k] == 1 else f"{k}#{seen[k]}"
            tasks.append(Task(id=f"p4g/{tid}", split=split, data=p))
        return tasks

    @classmethod
    def task_from_row(cls, row: dict[str, Any], split: str) -> Task:
        p = persona_row(row)
        return Task(id=f"p4g/{p['user_id']}", split=split, data=p)


def persuasion_lines(records: list[dict[str, Any]]) -> list[str]:
    """A dialogue card's lines on persuasion episodes (:meth:`PersuasionForGood.card_lines`): the persuader turns
    that name a dollar amount or the cause, and the persuadees' decisions where the episodes record them."""
    from collections import Counter

    turns = [m["content"] for e in records for m in e["messages"] if m["role"] == "agent"]
    dollars = sum(bool(re.search(r"\$\s*\d", t)) for t in turns) / max(len(turns), 1)
    cause = sum(bool(re.search(r"charit|children|donat|save the", t, re.IGNORECASE)) for t in turns)
    lines = [f"- agent turns that name a dollar amount: {dollars:.2f}"]
    if any("persona" in e["meta"] for e in records):
        gifts = Counter("none stated" if e["meta"].get("donation") is None else f"${e['meta']['donation']:g}"
                        for e in records)
        lines += ["- persuadees' decisions: " + ", ".join(f"{k} {v}" for k, v in gifts.most_common(6))
                  + f" (of {len(records)})",
                  f"- agent turns that mention the charity, children or donating: {cause / max(len(turns), 1):.2f}"]
    return lines


def fit_views(d: HumanDialogue) -> list[list[dict[str, str]]]:
    """What ``scope sim fit`` fits a persuadee to by default (``FitConfig.examples``): each real dialogue as this
    environment shows it to its persuadee (the persona in its system prompt), its last turn with the persuadee's
    actual ``[DONATE $N]``."""
    return [d.partner_view(PARTNER_PROMPT.format(persona=persona_text(d.persona)))]
