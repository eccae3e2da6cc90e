"""The post-chat surveys (after a King of the Hill replay: how human-like the blue team played).
Likert items are 1-7 (1 = strongly disagree, 7 = strongly agree); a ``reverse`` item is scored 8 - x in the
composite scores. P4G also asks the intended donation, a dollar amount in [0, 2]."""
from __future__ import annotations

import math
from typing import Any

LIKERT = (1, 7)

TAU2_ITEMS = [
    {"id": "satisfied", "text": "Overall, I am satisfied with how the agent handled my request."},
    {"id": "resolved", "text": "The agent resolved the issue I came with."},
    {"id": "understood", "text": "The agent understood what I needed."},
    {"id": "efficient", "text": "The conversation was efficient: the agent did not waste my time."},
    {"id": "clear", "text": "The agent's messages were clear and easy to follow."},
    {"id": "trust", "text": "I would trust this agent to handle my account."},
    {"id": "frustrated", "text": "I felt frustrated during this conversation.", "reverse": True},
    {"id": "reuse", "text": "I would use this agent again."},
]
P4G_ITEMS = [
    {"id": "persuasive", "text": "The other person's arguments were convincing."},
    {"id": "respectful", "text": "The other person respected my choices."},
    {"id": "engaging", "text": "The conversation was engaging."},
    {"id": "natural", "text": "The other person felt like a natural conversation partner."},
    {"id": "manipulated", "text": "I felt manipulated or pressured.", "reverse": True},
]
KOTH_ITEMS = [
    {"id": "humanlike", "text": "The blue team played the way a team of people would."},
    {"id": "skilled", "text": "The blue team played well."},
    {"id": "coordinated", "text": "The two blue units worked together."},
    {"id": "mechanical", "text": "The blue team's moves looked mechanical or random.", "reverse": True},
]
DONATION = {"id": "donation", "text": "How much of your $2 would you donate to Save the Children?",
            "min": 0.0, "max": 2.0}

SURVEYS: dict[str, dict[str, Any]] = {"tau2": {"likert": TAU2_ITEMS, "scale": LIKERT},
           "p4g": {"likert": P4G_ITEMS, "scale": LIKERT, "donation": DONATION},
           "koth": {"likert": KOTH_ITEMS, "scale": LIKERT}}


def items(kind: str) -> list[dict[str, Any]]:
    return SURVEYS[kind]["likert"]


def check_answers(kind: str, answers: Any) -> dict[str, Any] | str:
    """The answers, validated (every item once, integers 1-7, a donation in [0, 2]), or an error."""
    if not isinstance(answers, dict):
        return "answers must be an object of item -> value"
    want = [i["id"] for i in items(kind)] + (["donation"] if kind == "p4g" else [])
    extra = sorted(set(answers) - set(want))
    missing = [k for k in want if k not in answers]
    if extra or missing:
        return "survey: " + "; ".join(x for x in (f"missing {missing}" if missing else "",
                                                   f"unknown {extra}" if extra else "") if x)
    out: dict[str, Any] = {}
    for k in want:
        v = answers[k]
        if k == "donation":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 2:
                return "survey: donation must be a number of dollars from 0 to 2"
            out[k] = float(v)
        else:
            if isinstance(v, bool) or not isinstance(v, int) or not LIKERT[0] <= v <= LIKERT[1]:
                return f"survey: {k} must be an integer from {LIKERT[0]} to {LIKERT[1]}"
            out[k] = v
    return out


def composite(kind: str, answers: dict[str, Any]) -> float:
    """The mean of the Likert items, reverse-coded items scored 8 - x."""
    xs = [(LIKERT[0] + LIKERT[1] - answers[i["id"]]) if i.get("reverse") else answers[i["id"]] for i in items(kind)]
    return sum(xs) / len(xs)
