"""``env.name: koth``: an LLM commands a King of the Hill team, as a scope role.

Every ``every`` ticks (10) the agent gets the game rendered as text (``game.render``) and answers with one
skill per unit, e.g. ``1: capture`` and ``2: defend`` on lines of their own (``parse_skills``: both units,
each once, each a known skill; anything else is a bad answer, which keeps the previous skills and is
counted in ``meta.koth.bad_answers``; before the first valid one the team plays capture and defend). The
RL skills then play the ticks until the next decision. The other team is the behaviour tree, the flat RL
team, a random skill picker, or (``opponent: partner``) the partner role: a second LLM commanding the other
side, so that a frozen, rotated, persona-guided or trained opponent is a partner like any other. Reward
(``reward``): ``win`` (1 a win, 0.5 a draw, 0 a loss) or ``score`` (the team's share of the points); the
partner gets the complement. ``format_bonus`` adds that much times the share of a controller's answers
that parsed (a format reward: a small model's first signal). ``parse: lenient`` reads each line that starts
with a unit and a skill, whatever follows it (``parse_lenient``), for models too small for the strict form.

Tasks are game seeds: ``train`` seeds 0-999, ``test`` 10000-10199; the agent's side alternates with the seed.
``prefix`` (e.g. ``"1: "``) starts every controller reply: the model continues it, so that a small model
only has to complete the answer. With ``team`` other than ``llm`` the agent's side is a fixed team (``bt``,
``flat``, ``random``) and the whole game is played when the environment is made (a replay to show people:
``frames`` holds every tick).
"""
from __future__ import annotations

import random
import re
from functools import lru_cache
from typing import Any

import numpy as np

from ..envs.base import Env, register_env
from ..types import Task
from .game import N_UNITS, SIZE, TICKS, Games, render
from .policies import SKILLS, FlatTeam, SkillTeam, bt_team, mine, random_picker

SYSTEM = f"""You command a team of two units in King of the Hill, a game on an 11 x 11 grid. Your units are \
1 and 2, the enemies X, the hill the 3 x 3 square marked +. Each tick your team holds the hill alone (a unit \
of yours on it, none of theirs) it scores a point; after {TICKS} ticks the team with more points wins. Two \
opposing units that come next to each other meet: the side with more units close by wins and the other unit \
goes back to its start for a few ticks.
Every few ticks you choose one skill per unit, by its name or number: 1 capture (go to the hill and stay), \
2 defend (hold the hill and step onto enemies that come near), 3 intercept (chase the nearest enemy), 4 retreat \
(go back to the start).
Answer with exactly two lines, one skill per unit, for example:
1: capture
2: defend"""
_LINE = re.compile(r"^\s*(?:unit\s*)?([12])\s*[:=.)\-]\s*(?:([1-4])\b)?\s*([a-z]+)?\s*\.?\s*$",
                   re.IGNORECASE | re.MULTILINE)


def parse_skills(text: str) -> list[int] | None:
    """The skill indices for units 1 and 2, or None: both units named once each, each with a known skill by
    its name (``1: capture``), its number (``1: 1``) or both when they agree (``1: 1 capture``); lines that
    name no unit are ignored."""
    found: dict[int, int] = {}
    for m in _LINE.finditer(text):
        unit, num, word = int(m.group(1)), m.group(2), (m.group(3) or "").lower()
        if not num and not word:
            return None
        by_name = SKILLS.index(word) if word in SKILLS else None
        if (word and by_name is None) or (num and word and int(num) - 1 != by_name) or unit in found:
            return None
        found[unit] = by_name if by_name is not None else int(num) - 1
    if set(found) != {1, 2}:
        return None
    return [found[1], found[2]]


_LENIENT = re.compile(r"^\s*(?:unit\s*)?([12])\s*[:=.)\-]\s*(capture|defend|intercept|retreat|[1-4]\b)",
                      re.IGNORECASE | re.MULTILINE)


def parse_lenient(text: str, previous: list[int]) -> list[int] | None:
    """``parse: lenient``: each line that starts with a unit and a skill (its name or number) sets that unit's
    skill, whatever follows on the line; a unit no line names keeps ``previous``; None when no line does."""
    out, seen = list(previous), False
    for m in _LENIENT.finditer(text):
        word = m.group(2).lower()
        out[int(m.group(1)) - 1] = int(word) - 1 if word.isdigit() else SKILLS.index(word)
        seen = True
    return out if seen else None


@lru_cache(maxsize=2)
def _models(skills: str):
    from .skills import load_models

    return load_models() if skills == "rl" else None


def make_team(kind: str, skills: str = "rl", seed: int = 0):
    """A fixed team: ``bt`` (the behaviour tree, plain skills), ``flat`` (the flat RL team), ``random``
    (a random skill picker every 10 ticks, RL skills)."""
    models = _models(skills) if kind in ("flat", "random") or skills == "rl" else None
    if kind == "bt":
        return bt_team()
    if kind == "flat":
        assert models is not None, "koth: the flat team needs the RL models (skills=rl)"
        return FlatTeam(models["flat"])
    if kind == "random":
        return SkillTeam("random picker", random_picker(seed), {s: models[s] for s in SKILLS} if models else None,
                         every=10)
    raise ValueError(f"koth: unknown team {kind!r}; choose bt, flat, random or partner")


@register_env("koth")
class KingOfTheHill(Env):
    roles = ("agent", "partner")
    chat = False  # the agent's replies are commands (the study app keeps them and does not show them)

    def __init__(self, task: Task, rng: random.Random, opponent: str = "bt", every: int = 10, ticks: int = TICKS,
                 reward: str = "win", skills: str = "rl", noise: float = 0.1, team: str = "llm", prefix: str = "",
                 format_bonus: float = 0.0, parse: str = "strict", **_: Any):
        super().__init__(task, rng)
        if reward not in ("win", "score"):
            raise ValueError(f"koth: reward must be win or score, not {reward!r}")
        if skills not in ("rl", "scripted"):
            raise ValueError(f"koth: skills must be rl or scripted, not {skills!r}")
        if parse not in ("strict", "lenient"):
            raise ValueError(f"koth: parse must be strict or lenient, not {parse!r}")
        self.lenient = parse == "lenient"
        if team not in ("llm", "bt", "flat", "random"):
            raise ValueError(f"koth: team must be llm, bt, flat or random, not {team!r}")
        self.every, self.reward_kind, self.prefix, self.format_bonus = every, reward, prefix, float(format_bonus)
        self.side = int(task.data["side"])
        self.g = Games(1, ticks=ticks, seed=int(task.data["seed"]), noise=noise)
        models = _models(skills)
        sk = {s: models[s] for s in SKILLS} if models else None
        self.teams: dict[int, Any] = {}
        # before its first valid answer an LLM's team plays capture and defend (the answer the prompt shows)
        self.llm_skills: dict[str, list[int]] = {"agent": [0, 1], "partner": [0, 1]}
        if team == "llm":
            self.teams[self.side] = SkillTeam("llm", lambda g, t: np.array([self.llm_skills["agent"]]), sk)
        else:
            self.teams[self.side] = make_team(team, skills, seed=int(task.data["seed"]) + 1)
        self.team, self.opponent = team, opponent
        if opponent == "partner":
            self.teams[1 - self.side] = SkillTeam("llm", lambda g, t: np.array([self.llm_skills["partner"]]), sk)
        else:
            self.teams[1 - self.side] = make_team(opponent, skills, seed=int(task.data["seed"]))
        for t in self.teams.values():
            t.reset()
        self.bad = {"agent": 0, "partner": 0}
        self.answered: dict[str, bool] = {}
        self.history: list[dict[str, Any]] = []
        self.frames: list[dict[str, Any]] = []
        for role, side in (("agent", self.side), ("partner", 1 - self.side)):
            self.views[role] = [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": render(self.g, 0, side)}]
        if not self._llm_roles():
            self._play(ticks)

    def _llm_roles(self) -> list[str]:
        return [r for r, llm in (("agent", self.team == "llm"), ("partner", self.opponent == "partner")) if llm]

    def next_roles(self) -> list[str]:
        if self.done:
            return []
        return [r for r in self._llm_roles() if not self.answered.get(r)]

    def next_role(self) -> str | None:
        roles = self.next_roles()
        return roles[0] if roles else None

    def reply_prefix(self, role: str) -> str:
        """``prefix`` (e.g. ``1: ``) starts every controller reply, so that a small model only completes it."""
        return self.prefix

    def on_reply(self, role: str, text: str) -> None:
        self.turns[role] += 1
        self.views[role].append({"role": "assistant", "content": text})
        self.transcript.append({"role": role, "content": text})
        picked = parse_lenient(text, self.llm_skills[role]) if self.lenient else parse_skills(text)
        if picked is None:
            self.bad[role] += 1
        else:
            self.llm_skills[role] = picked
        self.answered[role] = True
        if all(self.answered.get(r) for r in self._llm_roles()):
            self.history.append({"tick": self.g.tick, **{r: [SKILLS[i] for i in self.llm_skills[r]]
                                                          for r in self._llm_roles()}})
            self._play(self.every)
            self.answered = {}

    def _play(self, n: int) -> None:
        for _ in range(n):
            if self.g.done:
                break
            self.frames.append(self.frame())
            a = np.zeros((1, N_UNITS), dtype=np.int64)
            for team, t in self.teams.items():
                a[:, mine(team)] = t.act(self.g, team)
            self.g.step(a)
        if self.g.done:
            self.frames.append(self.frame())
        if self.g.done:
            self.finish("game_over")
            return
        for role, team in (("agent", self.side), ("partner", 1 - self.side)):
            self.views[role].append({"role": "user", "content": render(self.g, 0, team)})

    def frame(self) -> dict[str, Any]:
        """The game now, from the agent's side (its units first): positions, who is out, the score."""
        order = mine(self.side) + mine(1 - self.side)
        pos = self.g.pos[0, order].copy()
        if self.side == 1:  # mirrored, so that the agent's team always starts on the left
            pos[:, 0] = SIZE - 1 - pos[:, 0]
        return {"tick": int(self.g.tick), "pos": pos.tolist(), "out": self.g.out[0, order].tolist(),
                "score": [int(self.g.score[0, self.side]), int(self.g.score[0, 1 - self.side])]}

    def rewards(self) -> dict[str, float]:
        mine_pts, theirs_pts = int(self.g.score[0, self.side]), int(self.g.score[0, 1 - self.side])
        result = 1.0 if mine_pts > theirs_pts else 0.0 if mine_pts < theirs_pts else 0.5
        r = result if self.reward_kind == "win" else mine_pts / max(1, mine_pts + theirs_pts)
        self.meta["koth"] = {"score": [mine_pts, theirs_pts], "result": result, "side": self.side,
                             "opponent": self.opponent, "bad_answers": dict(self.bad), "decisions": len(self.history),
                             "skills": self.history}
        valid = {role: 1.0 - self.bad[role] / max(1, self.turns[role]) for role in self._llm_roles()}
        return {"agent": r + self.format_bonus * valid.get("agent", 0.0),
                "partner": 1.0 - r + self.format_bonus * valid.get("partner", 0.0)}

    @classmethod
    def load_tasks(cls, split: str, **_: Any) -> list[Task]:
        seeds = {"train": range(0, 1000), "test": range(10000, 10200)}
        if split not in seeds:
            raise ValueError(f"koth: split must be train or test, not {split!r}")
        return [Task(id=f"koth/{s}", split=split, data={"seed": s, "side": s % 2}) for s in seeds[split]]
