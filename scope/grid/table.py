"""A grid's ``table.md``: per arm the held-out reward with its evaluation interval and the seeds' own values,
the training figures, then per simulator; the experiment's own sections (its hooks) below."""
from __future__ import annotations

import math
from typing import Any

from ..stats import TRAIN_WINDOW, fmt
from .summary import group_name


def interval(r: dict, k: str, nd: int = 3) -> str:
    """A mean with its evaluation interval: ``0.494 [0.451, 0.537]``."""
    if r.get(k) is None or (isinstance(r[k], float) and math.isnan(r[k])):
        return "n/a"
    lo, hi = r.get(k + "_lo"), r.get(k + "_hi")
    return fmt(r[k], nd) + (f" [{fmt(lo, nd)}, {fmt(hi, nd)}]" if lo is not None and not math.isnan(lo) else "")


def per_seed(r: dict, k: str, nd: int = 3) -> str:
    vals = [v for v in r.get(k + "_seeds", []) if v is not None and not math.isnan(v)]
    return ", ".join(fmt(v, nd) for v in vals) if vals else "n/a"


def table(results: dict[str, Any], labels: dict[str, str]) -> str:
    """The grid's table; ``results["sections"]`` (each a list of lines) follow it, a blank line before each one
that has lines."""
    lines = main_rows(results["arms"], labels) + footnote(results) + simulator_rows(results, labels)
    for section in results.get("sections", []):
        lines += [""] + list(section) if section else []
    return "\n".join(lines) + "\n"


def main_rows(rows: dict[str, dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """One row per arm; with columns for the unseen simulators of a training family and of another where the
    panel has simulators of another family (an evaluation reports the two apart)."""
    families = any(not math.isnan(r.get("unseen_other_family", math.nan)) for r in rows.values())
    extra = " unseen, a training simulator's family | unseen, another family |" if families else ""
    lines = ["| paradigm | held-out seen | held-out unseen | unseen, per seed |" + extra + " held-out all | unseen at "
             "the best-on-seen checkpoint | training reward, per seed | entropy start -> end | zero-variance (end) | "
             "simulator-side share start -> end | seeds |", "|---" * (11 + 2 * families) + "|"]
    for a, r in rows.items():
        ent = "n/a" if math.isnan(r["entropy_start"]) else f"{fmt(r['entropy_start'], 2)} -> {fmt(r['entropy_end'], 2)}"
        share = ("n/a" if math.isnan(r.get("partner_share_start", math.nan))
                 else f"{fmt(r['partner_share_start'], 2)} -> {fmt(r['partner_share_end'], 2)}")
        fam = (f" {interval(r, 'unseen_same_family')} | {interval(r, 'unseen_other_family')} |" if families else "")
        lines.append(f"| {labels[a]} | {interval(r, 'seen')} | {interval(r, 'unseen')} | {per_seed(r, 'unseen')} |"
                     f"{fam} {interval(r, 'all')} | {interval(r, 'unseen_at_best_seen')} | "
                     f"{per_seed(r, 'train_reward')} | {ent} | {fmt(r['zero_variance_end'], 2)} | {share} | "
                     f"{r['seeds']} |")
    return lines


def footnote(results: dict[str, Any]) -> list[str]:
    noise = [r["noise_unseen_se"] for r in results["arms"].values()
             if not math.isnan(r.get("noise_unseen_se", math.nan))]
    return ["", "Final held-out reward (the mean over seeds of the panel's mean per simulator group), with its 95% "
                "interval: a bootstrap over the evaluation's tasks, the same resample for every simulator and seed "
                "(evaluation noise given the trained policies). The seeds' own values are listed beside it: their "
                "spread is training noise, which the interval does not hold. "
                f"Training reward, entropy and zero-variance: the mean of the first / last {TRAIN_WINDOW} steps. "
                "Simulator-side share: the partner part of the reward variance (E[Var(R | agent turns)] / total, "
                "the variance decomposition) at its first and its last measurement. "
                "The bootstrap s.e. of one run's unseen mean is about "
                f"{fmt(sum(noise) / len(noise) if noise else math.nan)}."
                + (f" torch threads: {results['threads']} (the numbers depend on it)."
                   if results.get("threads") else "")]


def simulator_rows(results: dict[str, Any], labels: dict[str, str]) -> list[str]:
    from ..panels import SAME_FAMILY_MARK, SAME_WEIGHTS_MARK

    rows = results["arms"]
    first: dict[str, dict[str, Any]] = next((r["per_simulator"] for r in rows.values() if r.get("per_simulator")), {})
    sims, seen_of = list(first), {k: v.get("seen") for k, v in first.items()}
    if not sims:
        return []
    same = set(results.get("same_weights", []))
    unseen = [k for k in sims if seen_of.get(k) is False]
    family = set(unseen) if unseen and all(first[k].get("training_family") is True for k in unseen) else set()
    mark = lambda k: (SAME_WEIGHTS_MARK if k in same else "") + (SAME_FAMILY_MARK if k in family else "")  # noqa: E731
    lines = ["", "Final held-out reward per simulator (mean over seeds; 95% Wilson interval over all its "
                 "dialogues of every seed" + (f"; {SAME_WEIGHTS_MARK}: an unseen simulator on a training "
                                             "simulator's weights" if same else "")
             + (f"; {SAME_FAMILY_MARK}: every unseen simulator is of a training simulator's model family, so the "
                "unseen reward cannot tell an exploit that the family shares from a gain" if family else "") + "):", "",
             "| paradigm | " + " | ".join(f"{k}{mark(k)} ({group_name(seen_of.get(k))})" for k in sims) + " |",
             "|---|" + "---|" * len(sims)]
    for a, r in rows.items():
        ps = r.get("per_simulator", {})
        lines.append(f"| {labels[a]} | " + " | ".join(
            f"{fmt(ps[k]['mean'], 2)} [{fmt(ps[k]['lo'], 2)}, {fmt(ps[k]['hi'], 2)}]" if k in ps else "n/a"
            for k in sims) + " |")
    return lines
