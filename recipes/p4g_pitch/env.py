"""P4G-pitch: one pitch to a Persuasion for Good persona, scored by the persuadee's expected decision.

The persuader (agent) writes one short message asking a stranger to donate some of the $2 they just
earned to Save the Children. The persuadee (partner) reads it with a short persona (demographics and its
two most marked Big Five traits, so that its prompt stays small), is told that the chat ends, and its
reply is started with ``[DONATE $``. The amount is read to the dime from at most the first three tokens
after that start (``amount``): ``1.5`` is $1.50, ``2`` or more is $2, anything that is not a digit is no
amount. The agent's reward is the persuadee's *expected* reward, read from its own next-token
distributions at its temperature (a :class:`~scope.types.Readout`: every continuation that leaves the
amount open is expanded, so the expectation is exact, not sampled):

    reward = sum over amounts a of p(a) * min(a / 2, 1)          (no amount counts as $0)

so the reward moves with the pitch, not with one draw of the persuadee. The persuadee's reply is also
sampled from those same distributions (its ids and log-probs go into its trace, token in / token out);
that draw's reward is kept as ``meta["sampled_reward"]``, and it is what a trainable persuadee learns from:
its own reward is ``1 - sampled reward`` (adversarial; the expectation does not depend on its draw, so it
would carry no gradient to it).

Options:
- ``turns`` (1): persuader turns; with 2, the persuadee first answers the opening pitch freely
  (``partner.max_new_tokens``, e.g. 16 tokens) and the persuader writes a second one before the decision.
- ``decision`` (``forced``): ``verbal`` is the evaluation-only control: the persuadee is asked to say what it
  gives, without the forced start; the reward is then read from its sampled words (a ``[DONATE $N]`` marker or
  the first ``$N``), so it is a sampled reward, not an expectation.
- ``show_persona`` (False): the persuader also sees the short persona.
- ``reward`` (``expected``): ``mentions_children`` is the positive control (1 when the pitch says "child" or
  "children", else 0: a reward a 135M policy can surely learn, used to choose the learning rate).
- personas, split and data as in ``p4g``.
"""
from __future__ import annotations

import random
import re
from typing import Any, Literal

from scope.data.p4g import BIG5
from scope.envs.base import Env, register_env
from scope.envs.p4g import DECISION_PREFIX, PersuasionForGood, parse_donation
from scope.types import Readout, Task

NO_AMOUNT = "none"
"""The decision of a reply that states no amount (its reward is 0)."""

_INT = re.compile(r"[0-9]+")


def amount(text: str, final: bool) -> float | str | None:
    """The amount that ``text`` (what follows ``[DONATE $``) states, to the dime and clipped to [0, 2];
    ``NO_AMOUNT`` if it does not start with a digit; None while more text could still change it (an
    integer part below 2 with nothing after it, or a trailing point) unless ``final``."""
    if not text:
        return NO_AMOUNT if final else None
    m = _INT.match(text)
    if m is None:
        return NO_AMOUNT
    whole = int(m.group())
    if whole >= 2:
        return 2.0
    rest = text[m.end():]
    if not rest or (rest == "." and not final):
        return float(whole) if final else None
    if rest[0] == "." and len(rest) > 1 and rest[1] in "0123456789":
        return min(whole + int(rest[1]) / 10, 2.0)
    return float(whole)


AMOUNT = Readout(outcome=amount, max_tokens=3)


def reward_of(decision: float | str | None) -> float:
    return 0.0 if decision is None or decision == NO_AMOUNT else min(float(decision) / 2.0, 1.0)


def expected_reward(dist: dict[Any, float]) -> float:
    """sum_a p(a) min(a / 2, 1) over a readout's decision distribution."""
    return sum(p * reward_of(a) for a, p in dist.items())


def expected_amount(dist: dict[Any, float]) -> float:
    return sum(p * (0.0 if a == NO_AMOUNT else float(a)) for a, p in dist.items())


_VERBAL = re.compile(r"\$\s*(\d+(?:\.\d+)?)")


def verbal_amount(text: str) -> float | None:
    """A free reply's stated gift: its last ``[DONATE $N]`` marker, else its first ``$N``; None if neither."""
    a = parse_donation(text)
    if a is not None:
        return a
    m = _VERBAL.search(text)
    return None if m is None else min(max(float(m.group(1)), 0.0), 2.0)


_LEVELS = ((0.2, "very low"), (0.4, "low"), (0.6, "moderate"), (0.8, "high"), (1.01, "very high"))


def short_persona(p: dict[str, Any]) -> str:
    """Demographics and the two most marked Big Five traits (farthest from the scale's middle; ties in the
    order extraversion, agreeableness, conscientiousness, neuroticism, openness); a user's own persona text
    as written."""
    if p.get("persona"):
        return str(p["persona"])
    demo = []
    if p.get("age") is not None:
        demo.append(f"{int(p['age'])} years old")
    for k in ("sex", "marital", "religion", "ideology"):
        if p.get(k):
            demo.append(str(p[k]) if k == "religion" else str(p[k]).lower())
    if p.get("income") is not None:
        demo.append(f"income bracket {int(p['income'])} of 12")
    traits = [(abs(p[k] - 3.0), -i, name, p[k]) for i, (k, name) in enumerate(BIG5) if p.get(k) is not None]
    traits.sort(reverse=True)
    words = []
    for _, _, name, x in traits[:2]:
        t = (x - 1) / 4
        words.append(f"{next(w for lim, w in _LEVELS if t < lim)} {name}")
    out = "You are " + ", ".join(demo) + "." if demo else ""
    if words:
        out += (" " if out else "") + "Your personality: " + " and ".join(words) + "."
    return out


AGENT_PROMPT = (
    "You are a volunteer for the charity Save the Children, which helps children in need around the world. "
    "A stranger has just earned $2 for an online task. Write them one short message (one or two sentences) "
    "that persuades them to donate some or all of it to Save the Children.")
OPENING = "[Write your message to the stranger.]"
SECOND = "[Write one more short message to the stranger.]"
PARTNER_PROMPT = ("You are a person chatting online. You just earned $2 for a task. A stranger writes to you. "
                  "Reply briefly, in one sentence.\n{persona}")
DECISION_NOTE = "[The chat ends now. Decide how much of your $2 to donate, from 0 to 2 dollars.]"
VERBAL_NOTE = "[The chat ends now. Say in one sentence how much of your $2 you donate, from 0 to 2 dollars.]"
_CHILDREN = re.compile(r"\bchild(ren)?\b", re.IGNORECASE)


@register_env("p4g_pitch")
class P4GPitch(Env):
    roles = ("agent", "partner")

    def __init__(self, task: Task, rng: random.Random, turns: int = 1,
                 decision: Literal["forced", "verbal"] = "forced", show_persona: bool = False,
                 reward: Literal["expected", "mentions_children"] = "expected", **_: Any):
        super().__init__(task, rng)
        if turns not in (1, 2):
            raise ValueError(f"p4g_pitch: turns must be 1 or 2, not {turns}")
        self.turns_total, self.decision, self.reward_kind = turns, decision, reward
        persona = short_persona(task.data)
        agent_sys = AGENT_PROMPT + (f"\nThe stranger: {persona}" if show_persona else "")
        self.views["agent"] = [{"role": "system", "content": agent_sys}, {"role": "user", "content": OPENING}]
        self.views["partner"] = [{"role": "system", "content": PARTNER_PROMPT.format(persona=persona)}]
        self.meta["persona"] = task.data.get("user_id")
        self.dist: dict[Any, float] | None = None
        self.decided: float | str | None = None
        self.pitches: list[str] = []

    def _deciding(self) -> bool:
        return self.turns["agent"] >= self.turns_total

    def next_role(self) -> str | None:
        if self.done:
            return None
        return "agent" if self.turns["agent"] == self.turns["partner"] else "partner"

    def reply_prefix(self, role: str) -> str:
        return DECISION_PREFIX if role == "partner" and self._deciding() and self.decision == "forced" else ""

    def reply_readout(self, role: str) -> Readout | None:
        return AMOUNT if role == "partner" and self._deciding() and self.decision == "forced" else None

    def on_readout(self, role: str, dist: dict[Any, float]) -> None:
        self.dist = dist

    def on_reply(self, role: str, text: str) -> None:
        self.turns[role] += 1
        self.say(role, text)
        if role == "agent":
            self.pitches.append(text)
            if self._deciding():
                note = DECISION_NOTE if self.decision == "forced" else VERBAL_NOTE
                self.views["partner"][-1]["content"] += "\n\n" + note
            return
        if not self._deciding():  # the persuadee's free answer, then the instruction for the next message
            self.views["agent"][-1]["content"] += "\n\n" + SECOND
            return
        if self.decision == "forced":
            self.decided = amount(text[len(DECISION_PREFIX):], True) if text.startswith(DECISION_PREFIX) else NO_AMOUNT
        else:
            a = verbal_amount(text)
            self.decided = NO_AMOUNT if a is None else a
        self.meta["decision"] = self.decided
        self.meta["sampled_reward"] = reward_of(self.decided)
        if self.dist is not None:
            self.meta["decision_dist"] = {str(k): v for k, v in sorted(self.dist.items(), key=lambda kv: -kv[1])
                                          if v >= 1e-4}
            self.meta["expected_reward"] = expected_reward(self.dist)
            self.meta["expected_amount"] = expected_amount(self.dist)
        self.finish("done")

    def rewards(self) -> dict[str, float]:
        sampled = reward_of(self.decided)
        if self.reward_kind == "mentions_children":
            r = float(bool(self.pitches) and bool(_CHILDREN.search(self.pitches[0])))
        elif self.dist is not None:
            r = expected_reward(self.dist)
        else:  # verbal control: only a sampled decision exists
            r = sampled
        return {"agent": r, "partner": 1.0 - sampled}

    @classmethod
    def load_tasks(cls, split: str, personas: str = "builtin", split_seed: int = 0,
                   test_fraction: float = 0.2, data_dir: str | None = None, **_: Any) -> list[Task]:
        return [Task(id=t.id.replace("p4g/", "p4g_pitch/", 1), split=t.split, data=t.data)
                for t in PersuasionForGood.load_tasks(split, personas=personas, split_seed=split_seed,
                                                      test_fraction=test_fraction, data_dir=data_dir)]

    @classmethod
    def task_from_row(cls, row: dict[str, Any], split: str) -> Task:
        t = PersuasionForGood.task_from_row(row, split)  # the same persona, under this environment's id
        return Task(id=t.id.replace("p4g/", "p4g_pitch/", 1), split=split, data=t.data)
