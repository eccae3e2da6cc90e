"""The collapse alarms' thresholds, chosen on the lab's seed-0 runs, and how they do on runs they were not chosen
on (``python -m recipes.collapse_lab alarms``).

**Choosing** (``--choose GRID``, the lab's grid; its seed-0 runs only): each detector's rule is replayed offline
over every seed-0 run (:func:`scope.alarms.replay`) at each candidate threshold. In the lab, RL (Single) collapses
by construction (it learns the collapsed simulator's shortcut and ends below Base on the unseen customers), and the
cures do not, so an alarm on RL (Single) is a hit and one on a cure a false alarm. A detector's threshold is the
candidate with the most hits, then the fewest false alarms, then the earliest hit; the table of every candidate is
printed, and the chosen ones are what ``scope.alarms.DEFAULTS`` holds.

**Holding** (``--hold GRID ...``): the defaults, replayed on other grids' runs (the lab's seed 1, P4G-pitch's records
restored, ...): per run, which detectors fired and at which step, and per grid the step at which each RL (Single)
run trips each detector and how many cure runs trip any. No threshold is changed on these runs.
"""
from __future__ import annotations

import os
from typing import Any

from scope.alarms import DEFAULTS, replay
from scope.config import AlarmConfig
from scope.grid.records import finished_runs

CANDIDATES: dict[str, list[float]] = {
    "exploit": [1.0, 1.5, 2.0, 2.5, 3.0],
    "gap": [1.0, 1.5, 2.0, 2.5, 3.0],
    "entropy_floor": [0.10, 0.15, 0.20, 0.25, 0.30],
    "self_similarity_ceiling": [0.5, 0.6, 0.7, 0.8, 0.9],
    "zero_variance_ceiling": [0.5, 0.6, 0.7, 0.8, 0.9],
    "partner_modal_mass_ceiling": [0.8, 0.9, 0.95, 0.99],
}
REFERENCE, UNTRAINED = "single", "base"


def runs_of(grid: str, seed: int | None = None) -> list[tuple[str, int, str]]:
    """A grid's finished trained runs ``(arm, seed, run dir)``: every seed, or one."""
    return [(a, k, d) for a, k, d in finished_runs(grid) if a != UNTRAINED and (seed is None or k == seed)]


def fired(run_dir: str, detector: str, threshold: float | None = None) -> int | None:
    """The step at which ``detector`` (at ``threshold``, else its default) first fires on a run, replayed."""
    got = replay(run_dir, [AlarmConfig(name=detector, detector=detector, threshold=threshold)])
    return got[0].step if got else None


def choose(grid: str, seed: int = 0) -> dict[str, Any]:
    """Each detector's candidates on the grid's runs of ``seed``: hits (RL (Single) runs it fires on), false alarms
    (cure runs it fires on), the first hit's step; the chosen threshold per detector."""
    runs = runs_of(grid, seed)
    out: dict[str, Any] = {}
    for det, cands in CANDIDATES.items():
        rows = []
        for t in cands:
            steps = {(a, k): fired(d, det, t) for a, k, d in runs}
            hits = [s for (a, _), s in steps.items() if a == REFERENCE and s is not None]
            false = [(a, s) for (a, _), s in steps.items() if a != REFERENCE and s is not None]
            rows.append({"threshold": t, "hits": len(hits), "first_hit": min(hits) if hits else None,
                         "false_alarms": len(false), "false": false,
                         "reference_runs": sum(a == REFERENCE for a, _, _ in runs),
                         "cure_runs": sum(a != REFERENCE for a, _, _ in runs)})
        best = max(rows, key=lambda r: (r["hits"], -r["false_alarms"], -(r["first_hit"] or 10 ** 9)))
        out[det] = {"rows": rows, "chosen": best["threshold"]}
    return out


def hold(grids: dict[str, str]) -> dict[str, Any]:
    """The defaults replayed on every finished trained run of each grid (name -> directory, or ``DIR@1,2``: those
    seeds only, e.g. the lab's grid without the seed the thresholds were chosen on)."""
    out: dict[str, Any] = {}
    for name, spec in grids.items():
        grid, _, seeds = spec.partition("@")
        keep = {int(x) for x in seeds.split(",")} if seeds else None
        rows = []
        for a, k, d in runs_of(grid):
            if keep is not None and k not in keep:
                continue
            rows.append({"arm": a, "seed": k, "fired": {det: fired(d, det) for det in DEFAULTS}})
        out[name] = rows
    return out


def choose_markdown(res: dict[str, Any], seed: int) -> str:
    lines = [f"Each detector's candidate thresholds on the lab's seed-{seed} runs (RL (Single): a collapse, so a hit; "
             "the cures: a false alarm where it fires).", "",
             "| detector | threshold | RL (Single) runs it fires on (first step) | cure runs it fires on | chosen |",
             "|---|---|---|---|---|"]
    for det, x in res.items():
        for r in x["rows"]:
            fa = ", ".join(f"{a}@{s}" for a, s in r["false"]) or "none"
            chosen = "**yes**" if r["threshold"] == x["chosen"] else ""
            lines.append(f"| {det} | {r['threshold']} | {r['hits']} of {r['reference_runs']} ({r['first_hit']}) | "
                         f"{r['false_alarms']} of {r['cure_runs']}: {fa} | {chosen} |")
    return "\n".join(lines) + "\n"


def hold_markdown(res: dict[str, Any]) -> str:
    dets = list(DEFAULTS)
    lines = ["The defaults (" + ", ".join(f"{d} {DEFAULTS[d]['threshold']}" for d in dets) + "), replayed on runs they "
             "were not chosen on: the step each detector first fires at (- where it never does).", "",
             "| grid | run | " + " | ".join(dets) + " |", "|---|---|" + "---|" * len(dets)]
    for name, rows in res.items():
        for r in rows:
            lines.append(f"| {name} | {r['arm']}@{r['seed']} | " + " | ".join(
                str(r["fired"][d]) if r["fired"][d] is not None else "-" for d in dets) + " |")
    lines += ["", "| grid | RL (Single) runs: first step per detector | cure runs that trip any detector |",
              "|---|---|---|"]
    for name, rows in res.items():
        ref = [r for r in rows if r["arm"].startswith(REFERENCE)]
        cures = [r for r in rows if not r["arm"].startswith(REFERENCE)]
        tripped = [r for r in cures if any(v is not None for v in r["fired"].values())]
        lines.append(f"| {name} | " + "; ".join(f"{r['arm']}@{r['seed']}: " + ", ".join(
            f"{d} {r['fired'][d]}" for d in dets if r["fired"][d] is not None) for r in ref) +
                     f" | {len(tripped)} of {len(cures)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m recipes.collapse_lab alarms")
    ap.add_argument("--choose", metavar="GRID", help="the lab's grid whose seed-0 runs choose the thresholds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hold", nargs="*", default=[], metavar="NAME=GRID",
                    help="grids to replay the defaults on (GRID@1,2: those seeds only)")
    ap.add_argument("--out", help="write the tables and their JSON here")
    a = ap.parse_args(argv)
    text, data = "", {}
    if a.choose:
        data["choose"] = choose(a.choose, a.seed)
        text += choose_markdown(data["choose"], a.seed)
    if a.hold:
        data["hold"] = hold(dict(x.split("=", 1) for x in a.hold))
        text += ("\n" if text else "") + hold_markdown(data["hold"])
    print(text, end="")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "alarms.md"), "w") as f:
            f.write(text)
        with open(os.path.join(a.out, "alarms.json"), "w") as f:
            json.dump(data, f, indent=1)
    return 0
