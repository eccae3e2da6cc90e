"""The Persuasion for Good data: the persuadees' personas (the builtin sample, or every participant of the
original ``full_info.csv``) and their train/test split, and the real dialogues as the persuadee saw them (each
dialogue's turns, persuader and persuadee, consecutive sentences of one speaker merged, with the persuadee's
persona and actual donation), on the split's sides, so that a simulator fitted to the train side never sees a
test persuadee. The environment (``scope.envs.p4g``) and the fitted simulators (``scope.sim``) read it."""
from __future__ import annotations

import csv
import json
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any

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
PERSONAS_FILE = os.path.join(os.path.dirname(__file__), "p4g_personas.json")

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


@dataclass
class HumanDialogue:
    dialogue_id: str
    user_id: str
    persona: dict[str, Any]
    donation: float | None  # the persuadee's actual donation, clipped to [0, 2]; None where unknown
    turns: list[tuple[str, str]] = field(default_factory=list)  # (persuader | persuadee, text), in order

    def partner_view(self, system: str, marker: bool = True) -> list[dict[str, str]]:
        """The dialogue as the persuadee saw it: ``system`` (its system prompt, e.g. the P4G environment's with the
        persona), the persuader's turns as user messages, its own as assistant messages, from the first persuader
        turn. With ``marker``, the last persuadee turn ends with ``[DONATE $N]`` of the actual donation (the
        environment's own marker)."""
        msgs = [{"role": "system", "content": system}]
        started = False
        for role, text in self.turns:
            if role == "persuader":
                started = True
                if msgs[-1]["role"] == "user":  # (merged already; two in a row cannot happen)
                    msgs[-1]["content"] += " " + text
                else:
                    msgs.append({"role": "user", "content": text})
            elif started:
                msgs.append({"role": "assistant", "content": text})
        while msgs and msgs[-1]["role"] == "user":  # the persuader had the last word: the persuadee's is last
            msgs.pop()
        if marker and self.donation is not None and len(msgs) > 1 and msgs[-1]["role"] == "assistant":
            msgs[-1] = {"role": "assistant", "content": f"{msgs[-1]['content']} [DONATE ${self.donation:g}]"}
        return msgs


def shard_users(dialogues: list[HumanDialogue], shard: str, seed: int = 0) -> list[HumanDialogue]:
    """The dialogues of one of ``n`` disjoint random parts of the persuadees (``shard`` = ``"k/n"``, k from 1):
    the distinct user ids, sorted, are shuffled with ``random.Random(seed)`` and dealt into n parts of sizes
    differing by at most one; a persuadee with several dialogues stays in one part."""
    try:
        k, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise ValueError(f"shard must be 'k/n' (e.g. 1/4), not {shard!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"shard {shard!r}: k must be between 1 and n")
    users = sorted({d.user_id for d in dialogues})
    random.Random(seed).shuffle(users)
    mine = set(users[k - 1::n])
    return [d for d in dialogues if d.user_id in mine]


def load_dialogues(data_dir: str | None = None, split: str = "train", split_seed: int = 0,
                   test_fraction: float = 0.2) -> list[HumanDialogue]:
    """The P4G dialogues of the persuadees on one side of the environment's split (``train``, ``test`` or
    ``all``), in dialogue-id order. Reads ``full_info.csv`` and ``full_dialog.csv`` from ``data_dir`` or
    ``SCOPE_P4G_DATA``."""
    d = resolve_data_dir(data_dir)
    personas = {p["dialogue_id"]: p for p in split_personas(load_csv_personas(d), split, split_seed, test_fraction)}
    path = os.path.join(d, "full_dialog.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"P4G data: {path} not found (expected the original full_dialog.csv)")
    turns: dict[str, list[tuple[str, str]]] = {}
    last_turn: dict[str, tuple[str, str]] = {}
    with open(path, newline="") as f:
        rd = csv.DictReader(f)
        need = {"Unit", "Turn", "B4", "B2"}
        if not need <= set(rd.fieldnames or []):
            raise ValueError(f"{path}: expected columns {sorted(need)}")
        for r in rd:
            did, text = r["B2"], r["Unit"].strip()
            if did not in personas or not text:
                continue
            role = {"0": "persuader", "1": "persuadee"}.get(str(r["B4"]).strip())
            if role is None:
                continue
            key = (str(r["Turn"]).strip(), role)
            t = turns.setdefault(did, [])
            if t and last_turn.get(did) == key:  # another sentence of the same speaker's turn
                t[-1] = (role, t[-1][1] + " " + text)
            else:
                t.append((role, text))
            last_turn[did] = key
    out = []
    for did in sorted(turns):
        p = personas[did]
        don = p.get("donation")
        out.append(HumanDialogue(did, p["user_id"], p, None if don is None else min(max(float(don), 0.0), 2.0),
                                 turns[did]))
    return out
