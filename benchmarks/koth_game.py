"""King of the Hill's game speed: agent-steps per second (one unit's one tick) on one core, numpy-batched.

Steps batches of games with random actions (the rules alone), then whole games between the behaviour tree
and itself (the rules and the tree's per-tick choices), at a few batch sizes; the figure is the best
batch's agent-steps/s. Goal: at least 50,000 on one core.

    python benchmarks/koth_game.py
"""
from __future__ import annotations

import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core

import numpy as np  # noqa: E402

from report import report  # noqa: E402  (benchmarks/report.py; a script's own directory is on sys.path)
from scope.koth.game import N_UNITS, TICKS, Games  # noqa: E402
from scope.koth.policies import bt_team, play  # noqa: E402


def rules(n: int, reps: int = 3) -> float:
    best = 0.0
    for r in range(reps):
        g = Games(n, seed=r)
        rng = np.random.default_rng(r)
        acts = rng.integers(0, 5, (TICKS, n, N_UNITS))
        t = time.perf_counter()
        for k in range(TICKS):
            g.step(acts[k])
        best = max(best, n * N_UNITS * TICKS / (time.perf_counter() - t))
    return best


def tree_games(n: int, reps: int = 2) -> float:
    best = 0.0
    for r in range(reps):
        t = time.perf_counter()
        play(Games(n, seed=r), (bt_team(), bt_team()))
        best = max(best, n * N_UNITS * TICKS / (time.perf_counter() - t))
    return best


def main() -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print("| games in the batch | agent-steps/s, rules only | agent-steps/s, behaviour tree vs itself |")
    print("|---|---|---|")
    best_rules = best_tree = 0.0
    for n in (1, 64, 1024, 4096):
        a, b = rules(n), tree_games(n)
        best_rules, best_tree = max(best_rules, a), max(best_tree, b)
        print(f"| {n} | {a:,.0f} | {b:,.0f} |")
    print(f"best: rules {best_rules:,.0f} agent-steps/s, behaviour-tree games {best_tree:,.0f} agent-steps/s "
          f"(goal >= 50,000 on one core)")
    report("koth_game", agent_steps_per_s=best_rules, bt_game_agent_steps_per_s=best_tree)


if __name__ == "__main__":
    main()
