"""The real Persuasion for Good dialogues as the persuadee saw them: each dialogue's turns (persuader and
persuadee, consecutive sentences of one speaker merged), the persuadee's persona and actual donation, and
the train/test side of its persuadee under the P4G environment's own split (``split_personas``), so
that a simulator fitted to the train side never sees a test persuadee."""
from __future__ import annotations

import csv
import os
import random
import re
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

    def system_prompt(self, form: str = "p4g") -> str:
        """The persuadee's system prompt: the P4G environment's (``p4g``: the full persona) or P4G-pitch's
        (``pitch``: the short persona)."""
        if form == "pitch":
            from ..envs.p4g_pitch import PARTNER_PROMPT as PITCH_PROMPT, short_persona

            return PITCH_PROMPT.format(persona=short_persona(self.persona))
        if form != "p4g":
            raise ValueError(f"persona form must be 'p4g' or 'pitch', not {form!r}")
        return PARTNER_PROMPT.format(persona=persona_text(self.persona))

    def pitch(self, max_words: int = 48) -> str | None:
        """The persuader's pitch in this dialogue: its first turn that names the charity, donating or children
        (else its first turn), cut to ``max_words`` words; None if the persuader never spoke."""
        said = [t for r, t in self.turns if r == "persuader"]
        if not said:
            return None
        text = next((t for t in said if _PITCH.search(t)), said[0])
        return " ".join(text.split()[:max_words])

    def decision_view(self, form: str = "pitch") -> list[dict[str, str]] | None:
        """A forced decision as P4G-pitch asks for it: the persona, this dialogue's pitch followed by the
        decision note, and the reply ``[DONATE $N]`` with this participant's actual donation (None when the
        donation or the pitch is unknown)."""
        from ..envs.p4g_pitch import DECISION_NOTE

        pitch = self.pitch()
        if self.donation is None or pitch is None:
            return None
        return [{"role": "system", "content": self.system_prompt(form)},
                {"role": "user", "content": pitch + "\n\n" + DECISION_NOTE},
                {"role": "assistant", "content": f"[DONATE ${_dollars(self.donation)}]"}]

    def partner_view(self, marker: bool = True, form: str = "p4g") -> list[dict[str, str]]:
        """The dialogue as the P4G environment shows it to the persuadee (its system prompt with the persona,
        the persuader's turns as user messages, its own as assistant messages), starting at the first
        persuader turn. With ``marker``, the last persuadee turn ends with ``[DONATE $N]`` of the actual
        donation (the environment's own marker). ``form``: the system prompt (:meth:`system_prompt`)."""
        msgs = [{"role": "system", "content": self.system_prompt(form)}]
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


_PITCH = re.compile(r"save the children|charit|donat|child", re.IGNORECASE)


def _dollars(x: float) -> str:
    """An amount as a person writes it: 2, 0.5, 0.25."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


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
