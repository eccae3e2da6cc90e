"""Fitness of a persona population: human-likeness, coverage of real human behaviour, task integrity.

- **Human-likeness**: a logistic-regression classifier on turn features (``features.py``), trained once
  on real human turns (P4G persuadees, train users) against the default simulator's turns (the same
  model with no persona); its held-out AUC is reported. A population's human-likeness is the mean
  probability of "human" over its simulator's turns.
- **Coverage** (Naeem et al. 2020, "Reliable Fidelity and Diversity Metrics for Generative Models"): on
  standardised dialogue fingerprints, each held-out human dialogue gets a ball reaching its k-th nearest
  human neighbour; *coverage* is the share of human dialogues whose ball holds at least one simulated
  dialogue, *density* the mean number of balls a simulated dialogue falls in, over k. Coverage rewards
  spread: a population huddled at the human mean covers only the humans near the mean.
- **Task integrity** gates a persona in or out (``p4g_integrity``, ``tau2_integrity``): a persona whose
  simulator drops the task is rejected, not scored low.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from .features import FEATURES, turn_features


# ---- human-likeness ----------------------------------------------------------------------------------
class HumanLikeness:
    """Logistic regression (L2, full-batch gradient descent) on standardised turn features."""

    def __init__(self, l2: float = 1e-3, steps: int = 2000, lr: float = 0.5):
        self.l2, self.steps, self.lr = l2, steps, lr
        self.mu: Any = None  # numpy arrays once fitted
        self.sd: Any = None
        self.w: Any = None
        self.b = 0.0

    def _x(self, feats: np.ndarray) -> np.ndarray:
        return (feats - self.mu) / self.sd

    def fit(self, human: np.ndarray, sim: np.ndarray) -> "HumanLikeness":
        x = np.vstack([human, sim])
        y = np.concatenate([np.ones(len(human)), np.zeros(len(sim))])
        wt = np.where(y == 1, 0.5 / len(human), 0.5 / len(sim))  # both classes weigh the same
        self.mu, self.sd = x.mean(0), x.std(0) + 1e-6
        z = self._x(x)
        self.w, self.b = np.zeros(z.shape[1]), 0.0
        for _ in range(self.steps):
            p = 1 / (1 + np.exp(-(z @ self.w + self.b)))
            g = (p - y) * wt
            self.w -= self.lr * (z.T @ g + self.l2 * self.w)
            self.b -= self.lr * g.sum()
        return self

    def prob(self, feats: np.ndarray) -> np.ndarray:
        """P(human) of each row of turn features."""
        return 1 / (1 + np.exp(-(self._x(np.atleast_2d(feats)) @ self.w + self.b)))

    def score(self, turns: list[str]) -> float:
        """Mean P(human) over ``turns`` (nan for none)."""
        if not turns:
            return float("nan")
        return float(self.prob(np.array([turn_features(t) for t in turns])).mean())

    def state(self) -> dict[str, Any]:
        return {"mu": self.mu.tolist(), "sd": self.sd.tolist(), "w": self.w.tolist(), "b": self.b,
                "features": FEATURES}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> "HumanLikeness":
        if s.get("features") != FEATURES:
            raise ValueError("the saved classifier was trained on other features; train it again")
        c = cls()
        c.mu, c.sd, c.w, c.b = np.array(s["mu"]), np.array(s["sd"]), np.array(s["w"]), float(s["b"])
        return c


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting half."""
    pos, neg = np.asarray(pos, float), np.asarray(neg, float)
    if not len(pos) or not len(neg):
        return float("nan")
    allv = np.concatenate([pos, neg])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv))
    sv = allv[order]
    i = 0
    while i < len(sv):  # average ranks over ties
        j = i
        while j + 1 < len(sv) and sv[j + 1] == sv[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    r_pos = ranks[:len(pos)].sum()
    return float((r_pos - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


# ---- coverage -------------------------------------------------------------------------------------------
def density_coverage(real: np.ndarray, fake: np.ndarray, k: int = 5) -> dict[str, float]:
    """Density and coverage of ``fake`` against ``real`` (rows are points, already on one scale)."""
    real, fake = np.asarray(real, float), np.asarray(fake, float)
    if len(real) <= k or not len(fake):
        return {"density": float("nan"), "coverage": float("nan")}
    d_rr = np.linalg.norm(real[:, None, :] - real[None, :, :], axis=-1)
    radius = np.sort(d_rr, axis=1)[:, k]  # column 0 is the point itself
    d_rf = np.linalg.norm(real[:, None, :] - fake[None, :, :], axis=-1)  # (real, fake)
    inside = d_rf <= radius[:, None]
    return {"density": float(inside.sum() / (k * len(fake))), "coverage": float(inside.any(axis=1).mean())}


class Standardizer:
    """z-scores with the human reference's mean and spread (so every feature counts alike)."""

    def __init__(self, ref: np.ndarray):
        self.mu, self.sd = ref.mean(0), ref.std(0) + 1e-6

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, float) - self.mu) / self.sd


# ---- task integrity ---------------------------------------------------------------------------------------
_P4G_MARKER = re.compile(r"\[\s*DONATE\s*\$?\s*\d", re.IGNORECASE)
_P4G_AMOUNT = re.compile(r"(\$\s*\d|\b\d+(\.\d+)?\s*(dollars?|cents?)\b|\b(one|two) dollars?\b)", re.IGNORECASE)
_P4G_PLEDGE = re.compile(r"\b(i('ll| will)|i'd like to|i want to|i am going to|i'm going to|let me)\s+"
                         r"(donate|give|contribute)\b", re.IGNORECASE)
_P4G_PERSUADER = re.compile(r"\b(would you (like to |be willing to )?(donate|give|contribute)|"
                            r"(please|can you|could you|will you) (donate|give|contribute)|"
                            r"i('m| am) (a volunteer|volunteering) for|how much (would|will|can) you (donate|give))",
                            re.IGNORECASE)


def p4g_integrity(partner_turns: list[str]) -> str | None:
    """None if the simulator stayed a persuadee who states any donation with the marker; otherwise why
    not: it asked the other side to donate (it became the persuader), or it pledged an amount without
    ``[DONATE $N]``."""
    for t in partner_turns:
        if _P4G_PERSUADER.search(t):
            return f"plays the persuader: {t[:80]!r}"
        if _P4G_PLEDGE.search(t) and _P4G_AMOUNT.search(t) and not _P4G_MARKER.search(t):
            return f"states a donation without the marker: {t[:80]!r}"
    return None


def _flatten(v: Any) -> list[str]:
    if isinstance(v, dict):
        return [x for vv in v.values() for x in _flatten(vv)]
    if isinstance(v, list):
        return [x for vv in v for x in _flatten(vv)]
    return [str(v)] if isinstance(v, (str, int, float)) and not isinstance(v, bool) else []


def tau2_required_facts(task: dict[str, Any]) -> dict[str, str]:
    """The user-side facts the gold actions need: argument values of the gold actions that the user's
    scenario states (so only the user can give them), keyed by the argument's name."""
    sc = task.get("user_scenario") or {}
    text = " ".join(_flatten(sc.get("instructions") or {}) + _flatten(sc.get("persona") or "")).lower()
    out: dict[str, str] = {}
    for a in (task.get("evaluation_criteria") or {}).get("actions") or []:
        for k, v in (a.get("arguments") or {}).items():
            for s in _flatten(v):
                s_l = s.lower().lstrip("#")
                if len(s_l) >= 3 and s_l in text:
                    out.setdefault(k, s)
    return out


def _asked(name: str, agent_text: str) -> bool:
    words = [w for w in name.lower().split("_") if w not in ("id",)] or [name.lower()]
    return all(w in agent_text for w in words)


def tau2_integrity(transcript: list[dict[str, str]], task: dict[str, Any]) -> str | None:
    """None if every required user-side fact the agent asked for was said by the user (after it was
    asked, or before), else which one was withheld. The agent asks for a fact when one of its messages
    names the argument (``order_id``: "order"; ``zip``: "zip"; ``first_name``: "first" and "name")."""
    facts = tau2_required_facts(task)
    agent_seen = ""
    said = ""
    for m in transcript:
        if m["role"] == "agent":
            agent_seen += " " + m["content"].lower()
        elif m["role"] == "partner":
            said += " " + m["content"].lower()
    for name, value in facts.items():
        if _asked(name, agent_seen) and value.lower().lstrip("#") not in said:
            return f"withheld {name} ({value}) although the agent asked for it"
    return None
