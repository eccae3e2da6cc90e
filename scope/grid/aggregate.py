"""A grid's runs, aggregated per arm over its seeds: the means, their evaluation intervals and the seeds'
own values, and per simulator the mean with a Wilson interval over all its dialogues."""
from __future__ import annotations

import os
from typing import Any

from ..stats import mean_sd, task_bootstrap, wilson
from .summary import cells_at, group, run_summary

FIGURES = ("seen", "unseen", "all", "unseen_same_family", "unseen_other_family", "train_reward", "train_reward_start",
           "entropy_start", "entropy_end",
           "zero_variance_end", "unseen_peak", "unseen_drop_from_peak", "unseen_peak_over_start",
           "unseen_at_best_seen", "partner_share_start", "partner_share_end")
"""The per-run figures averaged over seeds (each with ``_std`` and ``_seeds`` beside it)."""


def runs_of(out: str, arms: list[str], seeds: int) -> dict[str, list[dict[str, Any]]]:
    """Each arm's runs under ``out`` (``<arm>/seed<k>``, those that wrote metrics), as :func:`run_summary`."""
    return {a: [run_summary(os.path.join(out, a, f"seed{s}")) for s in range(seeds)
                if os.path.exists(os.path.join(out, a, f"seed{s}", "metrics.jsonl"))] for a in arms}


def aggregate(out: str, arms: list[str], seeds: int, same_weights: set[str] | None = None) -> dict[str, Any]:
    """Per arm: the means over seeds, their evaluation intervals (a bootstrap over the tasks, every simulator
    and seed resampled with the same tasks: ``scope.stats.task_bootstrap``) and the seeds' own values (their
    spread, reported beside the interval, not in it); per simulator, the mean over seeds with a Wilson
    interval over all its episodes."""
    runs = runs_of(out, arms, seeds)
    return {"arms": {a: arm_row(rs, same_weights or set()) for a, rs in runs.items()}, "runs": runs,
            "same_weights": sorted(same_weights or [])}


def arm_row(rs: list[dict[str, Any]], same_weights: set[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"seeds": len(rs)}
    for k in FIGURES:
        vals = [r.get(k) for r in rs]
        row[k], row[k + "_std"] = mean_sd(vals)
        row[k + "_seeds"] = vals
    for k, step_of in (("seen", "last_eval_step"), ("unseen", "last_eval_step"), ("all", "last_eval_step"),
                       ("unseen_same_family", "last_eval_step"), ("unseen_other_family", "last_eval_step"),
                       ("unseen_at_best_seen", "best_seen_step")):
        which = "unseen" if k == "unseen_at_best_seen" else k
        cells = [c for r in rs if (c := cells_at(r, r.get(step_of))) is not None]
        if cells and rs and group(rs[0], which):
            b = task_bootstrap(cells, group(rs[0], which))
            row[k + "_lo"], row[k + "_hi"] = b["lo"], b["hi"]
            one: list[float | None] = [task_bootstrap([c], group(rs[0], which), resamples=500)["se"] for c in cells]
            row[f"noise_{which}_se" if k != "unseen_at_best_seen" else "noise_best_se"] = mean_sd(one)[0]
    row["per_simulator"] = per_simulator(rs, same_weights)
    return row


def per_simulator(rs: list[dict[str, Any]], same_weights: set[str]) -> dict[str, dict[str, Any]]:
    """Each simulator's final mean over seeds, with a Wilson interval pooled over every dialogue of every seed."""
    out: dict[str, dict[str, Any]] = {}
    first = rs[0].get("per_partner", {}) if rs else {}
    sims = {k for r in rs for k in (r.get("per_partner") or {})}
    for sim in sorted(sims, key=lambda k: list(first).index(k) if k in first else 99):
        means = [r["per_partner"][sim] for r in rs if sim in (r.get("per_partner") or {})]
        ns = [r.get("dialogues", {}).get(sim, 0) for r in rs if sim in (r.get("per_partner") or {})]
        m = sum(means) / len(means)
        # pooled over seeds: every dialogue of every seed a trial, at the seeds' dialogue-weighted mean
        pooled = sum(x * n for x, n in zip(means, ns)) / sum(ns) if sum(ns) else m
        lo, hi = wilson(pooled, sum(ns))
        fam = rs[0].get("families", {}).get(sim)
        out[sim] = {"mean": m, "lo": lo, "hi": hi, "dialogues": sum(ns), "seen": rs[0].get("seen_flags", {}).get(sim),
                    "same_weights": sim in same_weights, "family": fam[0] if fam else None,
                    "training_family": bool(fam[1]) if fam else None}
    return out
