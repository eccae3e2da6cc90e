"""The pre-registered signatures of P4G-pitch across families (README.md), from a grid's finished runs: each held,
not held, or not decidable (a run it needs is missing), with its numbers. Writes ``verdicts.json`` and
``verdicts.md`` in the grid."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

from recipes.p4g_pitch.verdicts import rollout_diversity
from scope.grid.records import finished_runs
from scope.grid.spec import read_spec
from scope.grid.summary import cells_at, run_summary
from scope.stats import Cells, fmt, holm, task_bootstrap

SMOL, GEMMA = ("P3", "P4"), ("G3", "G4")
SINGLES = {"single_p1": (SMOL, GEMMA), "single_g1": (GEMMA, SMOL)}
"""Each RL (Single) arm: (its training family's unseen pair, the other family's)."""
SEEDS = 2


def per_task(cells: Cells, members: tuple[str, ...]) -> dict[str, float]:
    """Each task's mean over ``members`` (the tasks every member has)."""
    tasks = set.intersection(*(set(cells.get(m, {})) for m in members)) if members else set()
    return {t: sum(cells[m][t] for m in members) / len(members) for t in tasks}


def _boot(values: dict[str, float]) -> dict[str, float]:
    """The mean of a per-task statistic with its bootstrap over the tasks."""
    return task_bootstrap([{"d": values}], ["d"])


class Grid:
    def __init__(self, grid: str, configs: str):
        spec = read_spec(configs)
        self.runs: dict[str, list[tuple[int, dict[str, Any], str]]] = {}
        for arm, seed, run_dir in finished_runs(grid, spec):
            self.runs.setdefault(arm, []).append((seed, run_summary(run_dir), run_dir))
        for v in self.runs.values():
            v.sort(key=lambda x: x[0])
        base = self.runs.get("base")
        self.base: Cells | None = cells_at(base[0][1], 0) if base else None

    def final(self, arm: str) -> list[tuple[int, Cells]]:
        return [(k, c) for k, r, _ in self.runs.get(arm, []) if (c := cells_at(r, r.get("last_eval_step")))]


def family_gain(g: Grid) -> dict[str, Any]:
    """Signature 1: per RL (Single) arm and seed, its gain on its own family's unseen pair minus its gain on the
    other family's, with its bootstrap s.e.; held for an arm when it is at least 2 s.e. in both seeds."""
    out: dict[str, Any] = {}
    for arm, (own, other) in SINGLES.items():
        rows: list[dict[str, Any]] = []
        for k, c in g.final(arm) if g.base is not None else []:
            b = g.base
            assert b is not None
            gain_own = {t: v - per_task(b, own).get(t, math.nan) for t, v in per_task(c, own).items()}
            gain_other = {t: v - per_task(b, other).get(t, math.nan) for t, v in per_task(c, other).items()}
            d = _boot({t: gain_own[t] - gain_other[t] for t in gain_own if t in gain_other})
            rows.append({"seed": k, "gain_own": _boot(gain_own)["mean"], "gain_other": _boot(gain_other)["mean"],
                         "diff": d["mean"], "se": d["se"], "lo": d["lo"], "hi": d["hi"],
                         "holds": bool(d["mean"] >= 2 * d["se"])})
        out[arm] = {"seeds": rows, "held": _decided([r["holds"] for r in rows])}
    return {"rule": "gain on the own family's unseen pair minus gain on the other family's >= 2 s.e., both seeds",
            "arms": out}


def below_base(g: Grid) -> dict[str, Any]:
    """Signature 2: per RL (Single) arm and seed, its final reward on the other family's unseen pair minus Base's;
    held for an arm when it is at most -2 s.e. in both seeds."""
    out: dict[str, Any] = {}
    for arm, (_, other) in SINGLES.items():
        rows: list[dict[str, Any]] = []
        for k, c in g.final(arm) if g.base is not None else []:
            assert g.base is not None
            d = task_bootstrap([c], list(other), minus=[g.base])
            rows.append({"seed": k, "diff": d["mean"], "se": d["se"], "lo": d["lo"], "hi": d["hi"],
                         "holds": bool(d["mean"] <= -2 * d["se"])})
        out[arm] = {"seeds": rows, "held": _decided([r["holds"] for r in rows])}
    return {"rule": "the other family's final unseen reward minus Base's <= -2 s.e., both seeds", "arms": out}


def worse_family(g: Grid) -> dict[str, Any]:
    """Signature 3: the Ensemble's worse-family unseen reward (over both seeds) against each RL (Single)'s, paired
    over the test personas; two-sided p-values, Holm-corrected over the comparisons; held when the Ensemble is
    above with every corrected p < 0.05."""
    def worse(arm: str) -> tuple[str, dict[str, float]] | None:
        fins = [c for _, c in g.final(arm)]
        if len(fins) < SEEDS:
            return None
        pair = min((SMOL, GEMMA), key=lambda m: task_bootstrap(fins, list(m))["mean"])
        vals = [per_task(c, pair) for c in fins]
        tasks = set.intersection(*(set(v) for v in vals))
        return "/".join(pair), {t: sum(v[t] for v in vals) / len(vals) for t in tasks}

    ens = worse("ensemble")
    comps: list[dict[str, Any]] = []
    for arm in SINGLES:
        s = worse(arm)
        if ens is None or s is None:
            continue
        d = _boot({t: ens[1][t] - s[1][t] for t in ens[1] if t in s[1]})
        comps.append({"single": arm, "ensemble_worse": ens[0], "single_worse": s[0], "diff": d["mean"],
                      "lo": d["lo"], "hi": d["hi"], "p": d["p"]})
    for c, adj in zip(comps, holm([c["p"] for c in comps])):
        c["p_holm"] = adj
    held = None if len(comps) < len(SINGLES) else all(c["p_holm"] < 0.05 and c["diff"] > 0 for c in comps)
    return {"rule": "the Ensemble's worse-family unseen reward above each RL (Single)'s (both seeds), Holm p < 0.05",
            "comparisons": comps, "held": held}


def diversity(g: Grid) -> dict[str, Any]:
    """Signature 4: token entropy, distinct pitches within a group and self-BLEU within a group (the first 4
    training steps against the last 4): each falls less (self-BLEU rises less) for the Ensemble than for each RL
    (Single), seed by seed."""
    def drops(arm: str) -> dict[int, dict[str, float]]:
        out = {}
        for k, r, d in g.runs.get(arm, []):
            dv = rollout_diversity(d)
            out[k] = {"entropy_drop": (r.get("entropy_start") or math.nan) - (r.get("entropy_end") or math.nan),
                      "distinct_drop": dv["distinct_start"] - dv["distinct_end"],
                      "self_bleu_rise": dv["self_bleu_end"] - dv["self_bleu_start"]}
        return out

    ens = drops("ensemble")
    singles = {arm: drops(arm) for arm in SINGLES}
    checks = [e[m] < singles[arm][k][m] for k, e in ens.items() for arm in SINGLES if k in singles[arm]
              for m in e]
    both = all(k in singles[arm] for k in range(SEEDS) for arm in SINGLES) and len(ens) >= SEEDS
    return {"rule": "each of entropy, distinct pitches and self-BLEU moves less for the Ensemble than for each RL "
                    "(Single), seed by seed", "ensemble": ens, "singles": singles,
            "held": (all(checks) if both else (False if not all(checks) else None))}


def _decided(ok: list[bool]) -> bool | None:
    if not all(ok):
        return False
    return True if len(ok) >= SEEDS else None


def verdicts(grid: str, configs: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    g = Grid(grid, configs)
    sig = {"family_gain": family_gain(g), "below_base_other_family": below_base(g),
           "worse_family_cure": worse_family(g), "diversity": diversity(g)}
    res = {"grid": grid, "runs": {a: [k for k, _, _ in v] for a, v in g.runs.items()}, "signatures": sig}
    with open(os.path.join(grid, "verdicts.json"), "w") as f:
        json.dump(res, f, indent=1, default=float)
    with open(os.path.join(grid, "verdicts.md"), "w") as f:
        f.write(verdicts_markdown(res))
    log(f"verdicts: wrote {grid}/verdicts.md")
    return res


def _hn(v: Any) -> str:
    return "**not decidable** (a run it needs is missing)" if v is None else "**held**" if v else "**not held**"


def verdicts_markdown(res: dict[str, Any]) -> str:
    s = res["signatures"]
    lines = ["# P4G-pitch across families: the pre-registered signatures", "",
             "Runs: " + ", ".join(f"{a} seeds {v}" for a, v in res["runs"].items()) + ". 95% bootstrap over the 48 "
             "test personas; s.e. that bootstrap's.", ""]
    for i, key in enumerate(("family_gain", "below_base_other_family"), 1):
        x = s[key]
        lines.append(f"{i}. {x['rule']}:")
        for arm, a in x["arms"].items():
            lines.append(f"   - {arm}: {_hn(a['held'])}; " + "; ".join(
                f"seed {r['seed']}: {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}], s.e. {fmt(r['se'])}"
                + (f" (own family's gain {r['gain_own']:+.3f}, the other's {r['gain_other']:+.3f})"
                   if "gain_own" in r else "") for r in a["seeds"]))
    x = s["worse_family_cure"]
    lines.append(f"3. {x['rule']}: {_hn(x['held'])}; " + "; ".join(
        f"against {c['single']}: {c['diff']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}] (Ensemble's worse "
        f"{c['ensemble_worse']}, Single's {c['single_worse']}), p {fmt(c['p'])}, Holm {fmt(c['p_holm'])}"
        for c in x["comparisons"]))
    x = s["diversity"]
    lines.append(f"4. {x['rule']}: {_hn(x['held'])}; Ensemble " + "; ".join(
        f"seed {k}: " + ", ".join(f"{m} {v:+.3f}" for m, v in d.items()) for k, d in x["ensemble"].items()))
    return "\n".join(lines) + "\n"
