"""2v2 King of the Hill on a small grid, stepped for many games at once with numpy.

The arena is ``SIZE`` x ``SIZE`` cells; the hill is the 3 x 3 square at its centre. Team 0 starts on the left
edge, team 1 on the right (units 0, 1 are team 0's; 2, 3 team 1's). Every tick each unit takes one action
(``ACTIONS``: stay, up, down, left, right; moves stop at the walls), all at once. Then:

- **tagging**: two opposing units at Manhattan distance 1 or less meet; the one with more teammates within
  distance 2 wins the meeting and the other is tagged; with equal numbers both are tagged. A tagged unit goes
  back to its spawn and is out for ``RESPAWN`` ticks (it does not move, score or tag);
- **scoring**: a team with one or more active units on the hill while the other team has none there scores
  one point (a contested or empty hill scores nothing).

A game lasts ``TICKS`` ticks; the team with more points wins (equal points: a draw). Moves slip: with
probability ``noise`` (0.1) a unit's action is replaced by a random one, drawn from the games' seeded
generator, so that two identical teams do not play the same game every time. Given its seed and its teams'
policies a batch of games is reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

SIZE = 11
HILL = (4, 7)  # [lo, hi) on both axes: the centre 3 x 3
TICKS = 100
RESPAWN = 3
ACTIONS = ("stay", "up", "down", "left", "right")
MOVES = np.array([[0, 0], [0, -1], [0, 1], [-1, 0], [1, 0]])  # (dx, dy); y grows downwards
SPAWN = np.array([[0, 4], [0, 6], [SIZE - 1, 4], [SIZE - 1, 6]])
TEAM = np.array([0, 0, 1, 1])
N_UNITS = 4


def on_hill(pos: np.ndarray) -> np.ndarray:
    """Whether each position (..., 2) lies on the hill."""
    # a numpy bool (not an array) for a single position, which works alike for every caller
    return cast(np.ndarray, ((pos >= HILL[0]) & (pos < HILL[1])).all(-1))


@dataclass
class Games:
    """``n`` games stepped together: positions (n, 4, 2), respawn timers (n, 4), scores (n, 2), tick."""

    n: int
    ticks: int = TICKS
    seed: int = 0
    noise: float = 0.1
    pos: np.ndarray = field(init=False)
    out: np.ndarray = field(init=False)
    score: np.ndarray = field(init=False)
    tags: np.ndarray = field(init=False)  # tags made by each unit (n, 4)
    tagged: np.ndarray = field(init=False)  # times each unit was tagged (n, 4)
    tick: int = 0
    rng: np.random.Generator = field(init=False)

    def __post_init__(self):
        self.reset()

    def reset(self) -> None:
        self.pos = np.broadcast_to(SPAWN, (self.n, N_UNITS, 2)).copy()
        self.out = np.zeros((self.n, N_UNITS), dtype=np.int64)
        self.score = np.zeros((self.n, 2), dtype=np.int64)
        self.tags = np.zeros((self.n, N_UNITS), dtype=np.int64)
        self.tagged = np.zeros((self.n, N_UNITS), dtype=np.int64)
        self.tick = 0
        self.rng = np.random.default_rng(self.seed)

    @property
    def done(self) -> bool:
        return self.tick >= self.ticks

    def active(self) -> np.ndarray:
        return self.out == 0

    def step(self, actions: np.ndarray) -> np.ndarray:
        """Apply one tick of ``actions`` (n, 4) ints; returns the points scored this tick (n, 2)."""
        actions = np.asarray(actions, dtype=np.int64).reshape(self.n, N_UNITS)
        if self.noise > 0:
            slip = self.rng.random((self.n, N_UNITS)) < self.noise
            actions = np.where(slip, self.rng.integers(0, len(ACTIONS), (self.n, N_UNITS)), actions)
        act = self.active()
        moves = MOVES[np.clip(actions, 0, len(ACTIONS) - 1)] * act[..., None]
        self.pos = np.clip(self.pos + moves, 0, SIZE - 1)
        self.out = np.maximum(self.out - 1, 0) * (~act)  # a unit that was out counts down (it did not move)
        act = act & (self.out == 0)
        # tagging: every pair of opposing active units within distance 1
        d = np.abs(self.pos[:, :, None, :] - self.pos[:, None, :, :]).sum(-1)  # (n, 4, 4)
        near = (d <= 2) & act[:, None, :] & act[:, :, None]
        same = TEAM[None, :, None] == TEAM[None, None, :]
        support = (near & same).sum(-1)  # teammates within 2, itself included
        meet = (d <= 1) & ~same & act[:, :, None] & act[:, None, :]
        stronger = support[:, None, :] > support[:, :, None]  # [i, j]: j outnumbers i
        equal = support[:, None, :] == support[:, :, None]
        hit = (meet & (stronger | equal)).any(-1)  # i is tagged by some j
        winners = meet & (support[:, :, None] >= support[:, None, :])  # i tags j
        self.tags += winners.sum(-1)
        self.tagged += hit
        if hit.any():
            self.pos = np.where(hit[..., None], SPAWN[None], self.pos)
            self.out = np.where(hit, RESPAWN, self.out)
            act = act & ~hit
        # scoring
        up = on_hill(self.pos) & act
        held = np.stack([up[:, TEAM == 0].any(-1), up[:, TEAM == 1].any(-1)], -1)
        pts = (held & ~held[:, ::-1]).astype(np.int64)
        self.score += pts
        self.tick += 1
        return pts

    def result(self) -> np.ndarray:
        """Per game: 1.0 if team 0 won, 0.0 if team 1 won, 0.5 for a draw."""
        return np.where(self.score[:, 0] > self.score[:, 1], 1.0,
                        np.where(self.score[:, 0] < self.score[:, 1], 0.0, 0.5))


def render(g: Games, i: int = 0, team: int = 0) -> str:
    """One game's state as text for a team's controller: the grid (its units 1, 2; enemies X; the hill +;
    out units are listed, not drawn), then each unit's position and the score."""
    mine = [u for u in range(N_UNITS) if TEAM[u] == team]
    theirs = [u for u in range(N_UNITS) if TEAM[u] != team]
    rows = [["+" if on_hill(np.array([x, y])) else "." for x in range(SIZE)] for y in range(SIZE)]
    for k, u in enumerate(mine):
        if g.out[i, u] == 0:
            x, y = g.pos[i, u]
            rows[y][x] = str(k + 1)
    for u in theirs:
        if g.out[i, u] == 0:
            x, y = g.pos[i, u]
            rows[y][x] = "X"
    grid = "\n".join(" ".join(r) for r in rows)

    def where(u):
        x, y = g.pos[i, u]
        state = f"out for {g.out[i, u]} ticks" if g.out[i, u] else ("on the hill" if on_hill(g.pos[i, u]) else "")
        return f"({x},{y}){' ' + state if state else ''}"
    units = "; ".join(f"unit {k + 1} {where(u)}" for k, u in enumerate(mine))
    enemies = "; ".join(f"enemy {k + 1} {where(u)}" for k, u in enumerate(theirs))
    side = "left" if team == 0 else "right"
    return (f"Tick {g.tick} of {g.ticks}. Score: you {g.score[i, team]}, them {g.score[i, 1 - team]}. "
            f"You start on the {side} edge.\n{grid}\n{units}\n{enemies}")
