"""Teams for King of the Hill: skills, the controllers that choose them, and whole-team policies.

A **skill** moves one unit: ``capture`` (to the nearest hill cell, and stay), ``defend`` (hold the hill and
step onto an enemy that comes near it), ``intercept`` (chase the nearest enemy), ``retreat`` (back to the
unit's spawn). Each exists written plainly (``scripted_action``, what the behaviour tree's units do) and as
a small RL policy trained with PPO (``skills.py``). A **controller** chooses one skill per unit: the
behaviour tree (``bt_skills``, every tick, by rules), a random picker, or an LLM (``env.py``, every few
ticks). A team is a controller plus its skills (``SkillTeam``), or one RL policy for both units trained end
to end (``FlatTeam``). Everything works on a batch of games at once; a team plays either side (team 1's
view is mirrored so that a policy always sees itself starting on the left).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .game import HILL, N_UNITS, SIZE, SPAWN, TEAM, Games, on_hill

SKILLS = ("capture", "defend", "intercept", "retreat")
HILL_CELLS = np.array([[x, y] for x in range(HILL[0], HILL[1]) for y in range(HILL[0], HILL[1])])
CENTRE = np.array([(HILL[0] + HILL[1] - 1) / 2] * 2)


def mine(team: int) -> list[int]:
    return [u for u in range(N_UNITS) if TEAM[u] == team]


def theirs(team: int) -> list[int]:
    return [u for u in range(N_UNITS) if TEAM[u] != team]


def toward(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The action (per row) that steps from ``src`` toward ``dst`` (n, 2): the longer axis first; stay when
    there."""
    d = dst - src
    horiz = np.abs(d[:, 0]) >= np.abs(d[:, 1])
    act = np.where(horiz, np.where(d[:, 0] > 0, 4, 3), np.where(d[:, 1] > 0, 2, 1))
    return np.where((d == 0).all(-1), 0, act)


def _nearest(src: np.ndarray, targets: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row: the nearest valid target (n, k, 2) and its distance (inf when none)."""
    d = np.abs(targets - src[:, None, :]).sum(-1).astype(float)
    d = np.where(valid, d, np.inf)
    k = d.argmin(-1)
    return targets[np.arange(len(src)), k], d[np.arange(len(src)), k]


def scripted_action(g: Games, unit: int, skill: np.ndarray) -> np.ndarray:
    """The plain implementation of each unit's skill (n,) -> actions (n,)."""
    team = TEAM[unit]
    me = g.pos[:, unit]
    enemies = g.pos[:, theirs(team)]
    alive = g.out[:, theirs(team)] == 0
    cells = np.broadcast_to(HILL_CELLS, (g.n, len(HILL_CELLS), 2))
    hill_target, _ = _nearest(me, cells, np.ones((g.n, len(HILL_CELLS)), bool))
    enemy, dist = _nearest(me, enemies, alive)
    act = np.zeros(g.n, dtype=np.int64)
    cap = toward(me, hill_target)
    act = np.where(skill == 0, cap, act)
    near_hill = np.abs(enemy - CENTRE).sum(-1) <= 4
    defend = np.where(np.isfinite(dist) & near_hill & (dist <= 3), toward(me, enemy), cap)
    act = np.where(skill == 1, defend, act)
    chase = np.where(np.isfinite(dist), toward(me, enemy), 0)
    act = np.where(skill == 2, chase, act)
    home = toward(me, np.broadcast_to(SPAWN[unit], (g.n, 2)))
    return np.where(skill == 3, home, act)


def bt_skills(g: Games, team: int) -> np.ndarray:
    """The behaviour tree, per unit, every tick (n, 2):
    an enemy adjacent and we are outnumbered near it -> retreat;
    an enemy within 2 of the hill and a teammate near -> intercept;
    on the hill -> defend;
    otherwise -> capture."""
    out = np.zeros((g.n, 2), dtype=np.int64)
    for k, u in enumerate(mine(team)):
        me = g.pos[:, u]
        mate = g.pos[:, mine(team)[1 - k]]
        mate_ok = g.out[:, mine(team)[1 - k]] == 0
        enemies = g.pos[:, theirs(team)]
        alive = g.out[:, theirs(team)] == 0
        d_me = np.where(alive, np.abs(enemies - me[:, None]).sum(-1), 99)
        d_hill = np.where(alive, np.abs(enemies - CENTRE).sum(-1), 99)
        threat = (d_me <= 1).any(-1)
        enemy_support = ((d_me <= 3).sum(-1))
        mine_support = 1 + (mate_ok & (np.abs(mate - me).sum(-1) <= 2))
        skill = np.zeros(g.n, dtype=np.int64)  # capture
        skill = np.where(on_hill(me), 1, skill)  # defend
        skill = np.where((d_hill <= 2).any(-1) & (mine_support >= 2), 2, skill)  # intercept
        skill = np.where(threat & (enemy_support > mine_support), 3, skill)  # retreat
        out[:, k] = skill
    return out


def observation(g: Games, unit: int) -> np.ndarray:
    """What an RL policy of ``unit`` sees (n, 19), mirrored for team 1 so that every unit starts on the left:
    its position, whether it is out, the teammate's and both enemies' positions relative to it and whether
    they are out, the hill centre and its spawn relative to it, whether it is on the hill, the game's
    progress, and the score difference."""
    team = TEAM[unit]
    pos = g.pos.astype(float)
    if team == 1:
        pos = pos.copy()
        pos[..., 0] = SIZE - 1 - pos[..., 0]
    me = pos[:, unit]
    others = [u for u in mine(team) if u != unit] + theirs(team)
    feats = [me / (SIZE - 1), (g.out[:, unit] > 0)[:, None]]
    for u in others:
        feats += [(pos[:, u] - me) / (SIZE - 1), (g.out[:, u] > 0)[:, None]]
    spawn = SPAWN[unit].astype(float).copy()
    if team == 1:
        spawn[0] = SIZE - 1 - spawn[0]
    feats += [(CENTRE - me) / (SIZE - 1), (spawn - me) / (SIZE - 1), on_hill(g.pos[:, unit])[:, None],
              np.full((g.n, 1), g.tick / g.ticks), ((g.score[:, team] - g.score[:, 1 - team]) / g.ticks)[:, None]]
    return np.concatenate([np.asarray(f, dtype=np.float32).reshape(g.n, -1) for f in feats], -1)


def unmirror(actions: np.ndarray, team: int) -> np.ndarray:
    """A mirrored policy's actions for team 1: left and right swap."""
    if team == 0:
        return actions
    return np.where(actions == 3, 4, np.where(actions == 4, 3, actions))


class SkillTeam:
    """A controller (``pick(games, team) -> (n, 2) skills``, consulted every ``every`` ticks) and skills
    (``skills``: one RL model per skill name, or None for the plain ones)."""

    def __init__(self, name: str, pick, skills: dict[str, Any] | None = None, every: int = 1):
        self.name, self.pick, self.skills, self.every = name, pick, skills, every
        self.current: np.ndarray | None = None
        self.picks = 0

    def reset(self) -> None:
        self.current, self.picks = None, 0

    def act(self, g: Games, team: int) -> np.ndarray:
        if self.current is None or g.tick % self.every == 0:
            self.current = self.pick(g, team)
            self.picks += 1
        out = np.zeros((g.n, 2), dtype=np.int64)
        for k, u in enumerate(mine(team)):
            skill = self.current[:, k]
            if self.skills is None:
                out[:, k] = scripted_action(g, u, skill)
                continue
            obs = observation(g, u)
            acts = np.zeros(g.n, dtype=np.int64)
            for s, name in enumerate(SKILLS):
                rows = skill == s
                if rows.any():
                    a, _ = self.skills[name].predict(obs[rows], deterministic=True)
                    acts[rows] = a
            out[:, k] = unmirror(acts, team)
        return out


class FlatTeam:
    """One RL policy for both units (MultiDiscrete actions), trained end to end on the team's reward."""

    def __init__(self, model, name: str = "flat RL"):
        self.model, self.name = model, name

    def reset(self) -> None:
        pass

    def act(self, g: Games, team: int) -> np.ndarray:
        obs = np.concatenate([observation(g, u) for u in mine(team)], -1)
        a, _ = self.model.predict(obs, deterministic=True)
        return unmirror(np.asarray(a).reshape(g.n, 2), team)


def random_picker(seed: int = 0):
    rng = np.random.default_rng(seed)
    return lambda g, team: rng.integers(0, len(SKILLS), (g.n, 2))


def bt_team(skills: dict[str, Any] | None = None) -> SkillTeam:
    return SkillTeam("behaviour tree", bt_skills, skills, every=1)


def play(g: Games, teams: tuple, on_tick=None) -> np.ndarray:
    """Play ``g`` to its end with team 0 and team 1; returns the results (1 team 0 won, 0.5 draw, 0 lost)."""
    for t in teams:
        t.reset()
    while not g.done:
        a = np.zeros((g.n, N_UNITS), dtype=np.int64)
        a[:, mine(0)] = teams[0].act(g, 0)
        a[:, mine(1)] = teams[1].act(g, 1)
        g.step(a)
        if on_tick is not None:
            on_tick(g)
    return g.result()
