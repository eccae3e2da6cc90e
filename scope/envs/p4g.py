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

import csv
import json
import math
import os
import random
import re
from typing import Any

from ..types import Task
from .base import Env, register_env

BIG5 = [("extrovert", "extraversion"), ("agreeable", "agreeableness"), ("conscientious", "conscientiousness"),
        ("neurotic", "neuroticism"), ("open", "openness")]
MORAL = ["care", "fairness", "loyalty", "authority", "purity"]
SCHWARTZ = ["freedom", "conform", "tradition", "benevolence", "universalism", "self_direction", "stimulation",
            "hedonism", "achievement", "power", "security"]
STYLE = ["rational", "intuitive"]
DEMO = ["age", "sex", "race", "edu", "marital", "employment", "income", "religion", "ideology"]
FIELDS = [k for k, _ in BIG5] + MORAL + SCHWARTZ + STYLE + DEMO

CATEGORICAL = ("sex", "race", "edu", "marital", "employment", "religion", "ideology")
"""The persona fields that are words; the others are numbers."""
PERSONAS_FILE = os.path.join(os.path.dirname(__file__), "data", "p4g_personas.json")

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


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def resolve_data_dir(path: str | None = None) -> str:
    """The directory with the original P4G ``full_info.csv``: ``env.options.data_dir`` or ``SCOPE_P4G_DATA``."""
    d = path or os.environ.get("SCOPE_P4G_DATA")
    if not d:
        raise FileNotFoundError("P4G data: personas 'real' reads the participants of Persuasion for Good from "
                                "full_info.csv; set env.options.data_dir or SCOPE_P4G_DATA to its directory")
    if not os.path.exists(os.path.join(d, "full_info.csv")):
        src = "env.options.data_dir" if path else "SCOPE_P4G_DATA"
        raise FileNotFoundError(f"P4G data: {os.path.join(d, 'full_info.csv')} not found ({src} = {d!r}); personas "
                                "'real' need the original full_info.csv there (env.options.data_dir or SCOPE_P4G_DATA)")
    return d


def load_builtin_personas(path: str = PERSONAS_FILE) -> list[dict[str, Any]]:
    with open(path) as f:
        personas = json.load(f)
    for p in personas:
        missing = [k for k in FIELDS + ["user_id"] if k not in p]
        if missing:
            raise ValueError(f"{path}: persona {p.get('user_id')!r} lacks fields {missing}")
    return personas


def load_csv_personas(data_dir: str) -> list[dict[str, Any]]:
    """Persuadee personas from the original ``full_info.csv`` (one per persuadee row)."""
    path = os.path.join(data_dir, "full_info.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"P4G data: {path} not found (expected the original full_info.csv)")
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = ["B2", "B3", "B4"] + [k + ".x" for k in FIELDS]
        lacking = [k for k in need if k not in (reader.fieldnames or [])]
        if lacking:
            raise ValueError(f"{path}: missing columns {lacking}")
        for row in reader:
            if str(row["B4"]).strip() != "1":
                continue
            p: dict[str, Any] = {"user_id": row["B3"], "dialogue_id": row["B2"],
                                 "donation": _num(row.get("B6"))}
            for k in FIELDS:
                v = row[k + ".x"]
                p[k] = _num(v) if k not in CATEGORICAL else (v if v not in ("", "NA") else None)
            out.append(p)
    return out


def split_personas(personas: list[dict[str, Any]], split: str, seed: int = 0,
                   test_fraction: float = 0.2) -> list[dict[str, Any]]:
    users = sorted({p["user_id"] for p in personas})
    random.Random(seed).shuffle(users)
    n_test = math.ceil(len(users) * test_fraction)
    test = set(users[:n_test])
    if split == "all":
        return personas
    if split not in ("train", "test"):
        raise ValueError(f"split must be train, test or all, not {split!r}")
    return [p for p in personas if (p["user_id"] in test) == (split == "test")]


def _level(x: float, lo: float, hi: float) -> str:
    t = (x - lo) / (hi - lo)
    return ("very low" if t < 0.2 else "low" if t < 0.4 else "moderate" if t < 0.6 else "high" if t < 0.8
            else "very high")


def persona_row(row: dict[str, Any]) -> dict[str, Any]:
    """A persona from a row of a user's tasks file: ``user_id`` and a ``persona`` text or any of FIELDS."""
    if row.get("user_id") in (None, ""):
        raise ValueError("no user_id (the persona's id)")
    if not isinstance(row.get("persona", ""), str):
        raise ValueError(f"persona: a text, not a {type(row['persona']).__name__}")
    if not row.get("persona") and not any(row.get(k) is not None for k in FIELDS):
        raise ValueError(f"neither a persona text nor any persona field ({', '.join(FIELDS[:3])}, ...)")
    out = {**row, "user_id": str(row["user_id"])}
    for k in FIELDS:
        v = out.get(k)
        if v is None or k in CATEGORICAL:
            continue
        try:
            if isinstance(v, bool):
                raise ValueError
            out[k] = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{k}: a number, not {v!r}") from None
    return out


def persona_text(p: dict[str, Any]) -> str:
    if p.get("persona"):  # a user's own persona, as written
        return str(p["persona"])
    lines = []
    demo = []
    if p.get("age") is not None:
        demo.append(f"{int(p['age'])} years old")
    for k in ("sex", "race", "marital", "employment", "religion", "ideology", "edu"):
        if p.get(k):
            demo.append(str(p[k]).lower() if k not in ("religion",) else str(p[k]))
    if p.get("income") is not None:
        demo.append(f"income bracket {int(p['income'])} of 12")
    if demo:
        lines.append("About you: " + ", ".join(demo) + ".")
    b5 = [f"{name} {_level(p[k], 1, 5)}" for k, name in BIG5 if p.get(k) is not None]
    if b5:
        lines.append("Personality: " + ", ".join(b5) + ".")
    mf = [f"{k} {_level(p[k], 1, 6)}" for k in MORAL if p.get(k) is not None]
    if mf:
        lines.append("Moral foundations: " + ", ".join(mf) + ".")
    sv = [f"{k.replace('_', '-')} {_level(p[k], 1, 6)}" for k in SCHWARTZ if p.get(k) is not None]
    if sv:
        lines.append("Values: " + ", ".join(sv) + ".")
    if p.get("rational") is not None and p.get("intuitive") is not None:
        style = "reason and facts" if p["rational"] >= p["intuitive"] else "gut feeling"
        lines.append(f"You decide mostly by {style}.")
    return "\n".join(lines)


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
