"""The behaviour fingerprint of a simulator's (or a person's) turns, and the P4G human corpus.

A turn's features (all in [0, 1] or a log count; the marker ``[DONATE $N]`` is removed first, people in
the original study had none):

style
  ``words``        log(1 + words) / log(1 + 100)
  ``question``     the turn asks something (contains "?")
  ``exclaim``      contains "!"
  ``informal``     lower-case start, "lol"/"haha"/"yeah"/"gonna"/"u " and the like, or no final punctuation
  ``first_person`` share of words that are I/me/my/mine/I'm/I've/I'd/I'll
disclosure
  ``disclose``     tells something about themself: "I have/I am/I work/my (kids|family|job|...)"
clarification
  ``clarify``      asks about the charity or the claim: a question with what/how/who/which/why/where/
                   percentage/legit/proof
reaction
  ``agree``        agrees or accepts: yes/sure/ok/agree/sounds good/of course/definitely
  ``pushback``     doubts or refuses: no/not/don't/can't/won't/but/however/skeptic/scam/rather not
  ``emotion``      a feeling word: sad/happy/love/wow/great/awful/terrible/heartbreaking/glad/sorry
  ``money``        talks money: $, dollar, cents, donate/donation, give/giving

A dialogue's fingerprint is the mean of its partner turns' features (the turns of one side).
"""
from __future__ import annotations

import csv
import math
import os
import random
import re
from typing import Any

import numpy as np

FEATURES = ["words", "question", "exclaim", "informal", "first_person", "disclose", "clarify", "agree",
            "pushback", "emotion", "money"]

_MARKER = re.compile(r"\[\s*DONATE[^\]]*\]?", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z']+")
_FIRST = {"i", "me", "my", "mine", "i'm", "i've", "i'd", "i'll", "im", "myself"}
_INFORMAL = re.compile(r"\b(lol|haha+|hehe|yeah|yep|nope|gonna|wanna|kinda|u|ur|thx|omg|btw|idk|cuz)\b", re.I)
_DISCLOSE = re.compile(r"\b(i have|i am|i'm a|i work|i used to|i was|my (kids?|children|son|daughter|family|job|wife|"
                       r"husband|mom|dad|mother|father|friend|income|paycheck|budget|money|work|life))\b", re.I)
_CLARIFY = re.compile(r"\b(what|how|who|which|why|where|percentage|legit|legitimate|proof|evidence|overhead)\b", re.I)
_AGREE = re.compile(r"\b(yes|yeah|yep|sure|ok|okay|agree|sounds good|of course|definitely|absolutely|happy to|"
                    r"i will|i'll)\b", re.I)
_PUSH = re.compile(r"\b(no|not|don't|dont|can't|cant|won't|wont|but|however|skeptic\w*|scam\w*|rather not|"
                   r"doubt\w*|unsure)\b", re.I)
_EMOTION = re.compile(r"\b(sad|happy|love|wow|great|awful|terrible|heartbreaking|glad|sorry|awesome|amazing|"
                      r"horrible|nice|wonderful)\b", re.I)
_MONEY = re.compile(r"(\$|\bdollars?\b|\bcents?\b|\bdonat\w*|\bgive\b|\bgiving\b)", re.I)


def turn_features(text: str) -> np.ndarray:
    t = _MARKER.sub(" ", text).strip()
    words = _WORD.findall(t)
    n = len(words)
    first = sum(w.lower() in _FIRST for w in words) / n if n else 0.0
    informal = bool(_INFORMAL.search(t)) or (bool(t) and t[0].islower()) or (bool(t) and t[-1] not in ".!?")
    f = {
        "words": math.log1p(n) / math.log1p(100),
        "question": float("?" in t),
        "exclaim": float("!" in t),
        "informal": float(informal),
        "first_person": min(1.0, first * 4),  # a quarter of the words or more counts as 1
        "disclose": float(bool(_DISCLOSE.search(t))),
        "clarify": float("?" in t and bool(_CLARIFY.search(t))),
        "agree": float(bool(_AGREE.search(t))),
        "pushback": float(bool(_PUSH.search(t))),
        "emotion": float(bool(_EMOTION.search(t))),
        "money": float(bool(_MONEY.search(t))),
    }
    return np.array([f[k] for k in FEATURES], dtype=float)


def fingerprint(turns: list[str]) -> np.ndarray:
    """The mean feature vector of one side's turns in one dialogue (zeros for no turns)."""
    if not turns:
        return np.zeros(len(FEATURES))
    return np.mean([turn_features(t) for t in turns], axis=0)


# ---- the P4G human corpus -----------------------------------------------------------------------------
def load_p4g_humans(data_dir: str, test_fraction: float = 0.2, split_seed: int = 0) -> dict[str, Any]:
    """The persuadees' turns of every P4G dialogue (``full_dialog.csv``, role B4 == 1), split by
    persuadee (``full_info.csv``: the same user never lands on both sides, as in the P4G environment's
    split). Returns {"train": [[turn, ...] per dialogue], "test": [...]}."""
    dialog = os.path.join(data_dir, "full_dialog.csv")
    info = os.path.join(data_dir, "full_info.csv")
    for p in (dialog, info):
        if not os.path.exists(p):
            raise FileNotFoundError(f"P4G human corpus: {p} not found (set humans.data_dir to the P4G data "
                                    "directory with full_dialog.csv and full_info.csv)")
    user_of = {}
    with open(info, newline="") as f:
        for r in csv.DictReader(f):
            if str(r.get("B4", "")).strip() == "1":
                user_of[r["B2"]] = r["B3"]
    turns: dict[str, list[str]] = {}
    with open(dialog, newline="") as f:
        rd = csv.DictReader(f)
        need = {"Unit", "B4", "B2"}
        if not need <= set(rd.fieldnames or []):
            raise ValueError(f"{dialog}: expected columns {sorted(need)}")
        for r in rd:
            if str(r["B4"]).strip() == "1" and r["Unit"].strip():
                turns.setdefault(r["B2"], []).append(r["Unit"].strip())
    users = sorted({user_of.get(d, d) for d in turns})
    random.Random(split_seed).shuffle(users)
    test_users = set(users[:math.ceil(len(users) * test_fraction)])
    out: dict[str, list[list[str]]] = {"train": [], "test": []}
    for d in sorted(turns):
        out["test" if user_of.get(d, d) in test_users else "train"].append(turns[d])
    return out
