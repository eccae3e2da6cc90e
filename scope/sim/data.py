"""The real Persuasion for Good dialogues as the persuadee saw them: each dialogue's turns (persuader and
persuadee, consecutive sentences of one speaker merged), the persuadee's persona and actual donation, and
the train/test side of its persuadee under the P4G environment's own split (``split_personas``), so
that a simulator fitted to the train side never sees a test persuadee."""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from typing import Any

from ..envs.p4g import PARTNER_PROMPT, load_csv_personas, persona_text, resolve_data_dir, split_personas


@dataclass
class HumanDialogue:
    dialogue_id: str
    user_id: str
    persona: dict[str, Any]
    donation: float | None  # the persuadee's actual donation, clipped to [0, 2]; None where unknown
    turns: list[tuple[str, str]] = field(default_factory=list)  # (persuader | persuadee, text), in order

    def partner_view(self, marker: bool = True) -> list[dict[str, str]]:
        """The dialogue as the P4G environment shows it to the persuadee (its system prompt with the persona,
        the persuader's turns as user messages, its own as assistant messages), starting at the first
        persuader turn. With ``marker``, the last persuadee turn ends with ``[DONATE $N]`` of the actual
        donation (the environment's own marker)."""
        msgs = [{"role": "system", "content": PARTNER_PROMPT.format(persona=persona_text(self.persona))}]
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
