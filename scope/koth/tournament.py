"""``scope koth tournament``: every pair of teams plays N games (seeded, sides swapped half of the time).

Teams: ``bt`` (the behaviour tree), ``flat`` (the flat RL team), ``random`` (a random skill picker with the
RL skills), ``llm`` (an LLM controller with the RL skills: the embedded SmolLM2 by default, or any model
reference), and ``llm:<checkpoint>`` (a ``scope train`` checkpoint of the controller, e.g. trained with
GRPO on the koth environment). Games between fixed teams run as one numpy batch; games with an LLM run
through scope's rollout engine (the koth environment), batched across games.

Per pair: wins, draws and losses of the first team, its score (a draw counts half) with a 95% Wilson
interval over games (it stays inside [0, 1] at 200-0), and a two-sided exact binomial test of its wins against
its losses (draws left out: is it better than an even match?). For two teams against the same opponents, a two-sided
two-proportion z-test compares their win rates (the comparison the source work reports, LLM+RL against the
behaviour tree; the source does not name its test).
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
from typing import Any, Callable

import numpy as np

from ..stats import wilson
from .game import Games
from .policies import play

FIXED = ("bt", "flat", "random")


def stats(results: list[float]) -> dict[str, Any]:
    from scipy.stats import binomtest

    r = np.array(results, dtype=float)
    wins, draws, losses = int((r == 1).sum()), int((r == 0.5).sum()), int((r == 0).sum())
    mean = float(r.mean()) if len(r) else float("nan")
    p = binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else float("nan")
    return {"games": len(r), "wins": wins, "draws": draws, "losses": losses, "score": mean,
            "ci95": wilson(mean, len(r)), "p_even": float(p)}


def two_proportion(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Two-sided p of a two-proportion z-test on the win rates (wins / games) of a and b."""
    n1, n2 = a["games"], b["games"]
    p1, p2 = a["wins"] / n1, b["wins"] / n2
    p = (a["wins"] + b["wins"]) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    if se == 0:
        return 1.0
    from scipy.stats import norm

    return float(2 * norm.sf(abs(p1 - p2) / se))


def fixed_games(a: str, b: str, games: int, seed: int, skills: str = "rl") -> list[float]:
    """``a`` against ``b``: half the games with ``a`` on the left, half on the right; results for ``a``."""
    from .env import make_team

    half = games // 2
    g = Games(half, seed=seed)
    r1 = play(g, (make_team(a, skills, seed), make_team(b, skills, seed + 1)))
    g = Games(games - half, seed=seed + 7919)
    r2 = 1.0 - play(g, (make_team(b, skills, seed + 1), make_team(a, skills, seed)))
    return list(r1) + list(r2)


def llm_games(agent, opponent: str, games: int, seed: int, partner=None, every: int = 10,
              max_context: int = 4096, skills: str = "rl", prefix: str = "",
              bad: list[int] | None = None, parse: str = "strict") -> list[float]:
    """An LLM controller (``agent``: a Binding) against ``opponent`` (a fixed team, or ``partner``: another
    LLM binding), through the koth environment; results for the agent."""
    from ..envs.base import get_env
    from ..rollout import Play, make_jobs, run_rollouts
    from ..types import Episode, Task

    env_cls = get_env("koth")
    rng = random.Random(seed)
    refs = {"agent": agent} | ({"partner": partner} if partner else {})
    plays = []
    for i in range(games):
        s = seed * 1000 + i
        task = Task(id=f"koth/{s}", split="test", data={"seed": s, "side": i % 2})
        plays.append(Play(task, Episode(task.id, f"koth:{opponent}:{i}", 0), dict(refs)))
    options = dict(opponent="partner" if partner else opponent, every=every, skills=skills, prefix=prefix, parse=parse)
    eps, _ = run_rollouts(make_jobs(env_cls, plays, options, rng, "koth"), max_context=max_context,
                          end_on_truncation=False)
    out = []
    for e in eps:
        out.append(e.meta["koth"]["result"] if not e.failed and "koth" in e.meta else 0.0)
        if bad is not None and "koth" in e.meta:  # [bad answers, decisions] of the agent's side
            bad[0] += e.meta["koth"]["bad_answers"]["agent"]
            bad[1] += e.meta["koth"]["decisions"]
    return out


def run(teams: list[str], games: int, seed: int = 0, agents: dict[str, Any] | None = None,
        log: Callable[[str], None] = print, skills: str = "rl", every: int = 10, prefix: str = "",
        parse: str = "strict") -> dict[str, Any]:
    """Every pair of ``teams``; ``agents``: the Binding of each LLM team name; ``skills``: rl or scripted (the
    skills the LLM and random teams command)."""
    agents = agents or {}
    pairs = {}
    bad = {t: [0, 0] for t in agents}
    for k, (a, b) in enumerate(itertools.combinations(teams, 2)):
        s = seed + 101 * k
        if a in agents and b in agents:
            res = llm_games(agents[a], "partner", games, s, partner=agents[b], skills=skills, every=every,
                            prefix=prefix, parse=parse)
        elif a in agents:
            res = llm_games(agents[a], b, games, s, skills=skills, every=every, prefix=prefix, bad=bad[a],
                            parse=parse)
        elif b in agents:
            res = [1.0 - x for x in llm_games(agents[b], a, games, s, skills=skills, every=every, prefix=prefix,
                                              bad=bad[b], parse=parse)]
        else:
            res = fixed_games(a, b, games, s, skills)
        pairs[f"{a} vs {b}"] = stats(res)
        st = pairs[f"{a} vs {b}"]
        log(f"koth: {a} vs {b}: {st['wins']}-{st['draws']}-{st['losses']} (score {st['score']:.3f}, "
            f"p even {st['p_even']:.3g})")
    out: dict[str, Any] = {"teams": teams, "games": games, "seed": seed, "skills": skills, "every": every,
                           "prefix": prefix, "parse": parse, "pairs": pairs,
                           "bad_answer_rate": {t: b[0] / b[1] for t, b in bad.items() if b[1]},
                           "comparisons": {}}
    for x, y in itertools.combinations(teams, 2):  # x and y against the same third teams
        for z in teams:
            if z in (x, y):
                continue
            sx, sy = _against(pairs, x, z), _against(pairs, y, z)
            if sx and sy:
                out["comparisons"][f"{x} vs {y}, against {z}"] = {"wins": [sx["wins"] / sx["games"],
                                                                          sy["wins"] / sy["games"]],
                                                                 "p": two_proportion(sx, sy)}
    return out


def _against(pairs: dict[str, Any], x: str, z: str) -> dict[str, Any] | None:
    if f"{x} vs {z}" in pairs:
        return pairs[f"{x} vs {z}"]
    if f"{z} vs {x}" in pairs:
        s = pairs[f"{z} vs {x}"]
        return {**s, "wins": s["losses"], "losses": s["wins"], "score": 1 - s["score"]}
    return None


def table(res: dict[str, Any]) -> str:
    lines = ["| pair | games | wins-draws-losses (first team) | score (95% interval) | p (even match) |",
             "|---|---|---|---|---|"]
    for k, s in res["pairs"].items():
        lines.append(f"| {k} | {s['games']} | {s['wins']}-{s['draws']}-{s['losses']} | {s['score']:.3f} "
                     f"({s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}) | {s['p_even']:.3g} |")
    if res.get("bad_answer_rate"):
        lines += ["", "| LLM team | bad answers (against the fixed teams) |", "|---|---|"]
        lines += [f"| {t} | {r:.3f} |" for t, r in res["bad_answer_rate"].items()]
    if res["comparisons"]:
        lines += ["", "| comparison | win rates | p (two-proportion z) |", "|---|---|---|"]
        for k, c in res["comparisons"].items():
            lines.append(f"| {k} | {c['wins'][0]:.3f} vs {c['wins'][1]:.3f} | {c['p']:.3g} |")
    return "\n".join(lines) + "\n"


def write(res: dict[str, Any], out: str) -> str:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tournament.json"), "w") as f:
        json.dump(res, f, indent=1)
    path = os.path.join(out, "tournament.md")
    with open(path, "w") as f:
        f.write(table(res))
    return path
