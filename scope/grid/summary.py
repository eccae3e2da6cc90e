"""One run of a grid, read back from its directory: its final panel scores, its curves, every evaluation's
per-task rewards (:data:`scope.stats.Cells`) and the training figures at its start and end."""
from __future__ import annotations

import json
import os
from typing import Any

from ..stats import Cells, window

CURVES = [("reward_mean", "training reward"), ("eval/unseen_mean", "held-out reward (unseen simulators)"),
          ("policy_entropy", "policy entropy (nats/token)"), ("zero_variance_frac", "zero-variance group fraction"),
          ("partner_behaviour/modal_mass", "simulator behaviour modal mass")]
"""The metrics a grid plots per arm (``curves.png``), and their titles."""
DECOMPOSITION = ("collapse/partner_share", "collapse/partner_var", "collapse/agent_var")


def eval_cells(run_dir: str) -> tuple[dict[int, Cells], dict[str, bool | str], dict[int, dict[str, int]],
                                      dict[str, tuple[str, bool]]]:
    """Each evaluation of a run as :data:`scope.stats.Cells` (simulator -> task -> mean reward), by step,
    each simulator's seen flag, by step each simulator's number of dialogues, and each simulator's model family
    and whether it is a training simulator's (where the evaluation recorded it), from
    ``eval/step_N/eval_episodes.jsonl`` and ``eval.json``."""
    from ..stats import cells_of

    d = os.path.join(run_dir, "eval")
    cells: dict[int, Cells] = {}
    seen: dict[str, bool | str] = {}  # seen (True), unseen (False) or "control"
    counts: dict[int, dict[str, int]] = {}
    families: dict[str, tuple[str, bool]] = {}  # simulator -> (its family, of a training simulator's)
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        path = os.path.join(d, name, "eval_episodes.jsonl")
        if not name.startswith("step_") or not os.path.exists(path):
            continue
        with open(path) as f:
            cells[int(name[len("step_"):])] = cells_of(json.loads(x) for x in f if x.strip())
        if os.path.exists(os.path.join(d, name, "eval.json")):
            with open(os.path.join(d, name, "eval.json")) as f:
                per = json.load(f)["per_partner"]
            seen = {k: "control" if v.get("control") else bool(v["seen"]) for k, v in per.items()}
            counts[int(name[len("step_"):])] = {k: int(v["n"]) for k, v in per.items()}
            families = {k: (v["family"], bool(v.get("training_family"))) for k, v in per.items() if "family" in v}
    return cells, seen, counts, families


def run_summary(run_dir: str) -> dict[str, Any]:
    """Final scores, curves, every evaluation's per-task rewards and the start and end figures of one run."""
    from ..run import read_metrics

    ms = read_metrics(run_dir)
    ev = [m for m in ms if "eval/panel_mean" in m]
    last = ev[-1] if ev else {}
    curves = {k: [(m["step"], m[k]) for m in ms if isinstance(m.get(k), (int, float))]
              for k in [k for k, _ in CURVES] + list(DECOMPOSITION)}
    cells, seen_flags, counts, families = eval_cells(run_dir)
    out = {"seen": last.get("eval/seen_mean"), "unseen": last.get("eval/unseen_mean"),
           "unseen_same_family": last.get("eval/unseen_same_family_mean"),
           "unseen_other_family": last.get("eval/unseen_other_family_mean"), "families": families,
           "all": last.get("eval/panel_mean"), "unseen_se": last.get("eval/unseen_se"),
           "seen_se": last.get("eval/seen_se"), "panel_se": last.get("eval/panel_se"), "curves": curves,
           "per_partner": {k[len("eval/partner/"):]: v for k, v in last.items() if k.startswith("eval/partner/")},
           "cells": {str(k): v for k, v in cells.items()}, "seen_flags": seen_flags,
           "dialogues": counts.get(int(last["step"]), {}) if last else {},
           "last_eval_step": last.get("step"),
           "alarms": [(int(m["step"]), e["name"]) for m in ms for e in m.get("alarm_events", [])]}
    out.update(_training(ms, curves))
    out.update(_unseen_course(curves["eval/unseen_mean"]))
    seen = [m for m in ev if m["step"] > 0 and isinstance(m.get("eval/seen_mean"), (int, float))]
    if seen:  # the checkpoint training keeps (chosen on the seen simulators) and its unseen score
        best = max(seen, key=lambda m: (m["eval/seen_mean"], -m["step"]))
        out["best_seen_step"], out["unseen_at_best_seen"] = best["step"], best.get("eval/unseen_mean")
    return out


def _training(ms: list[dict[str, Any]], curves: dict[str, list]) -> dict[str, Any]:
    """The training reward, entropy and zero-variance over the first and last steps (``scope.stats.window``), and
    the variance decomposition's partner share at its first and last measurement."""
    tr = [m for m in ms if "reward_mean" in m]
    if not tr:
        return {}
    ent = [m["policy_entropy"] for m in tr if "policy_entropy" in m]
    share = [v for _, v in curves["collapse/partner_share"]]
    # measured every few steps only (diagnostics.decompose_every): its first and its last measurement, as a
    # window of 4 measurements would span most of a short run at both ends
    return {"train_reward": window([m["reward_mean"] for m in tr]),
            "train_reward_start": window([m["reward_mean"] for m in tr], end=False),
            "entropy_start": window(ent, end=False), "entropy_end": window(ent),
            "zero_variance_end": window([m["zero_variance_frac"] for m in tr if "zero_variance_frac" in m]),
            "partner_share_start": share[0] if share else None, "partner_share_end": share[-1] if share else None}


def _unseen_course(un: list[tuple[int, float]]) -> dict[str, Any]:
    """The unseen reward's best trained evaluation, where it was, and how far the last one fell from it."""
    trained = [(s, v) for s, v in un if s > 0]  # the step-0 evaluation is the policy as built, not training
    if not trained:
        return {}
    out = {"unseen_peak": max(v for _, v in trained),
           "unseen_peak_step": max(trained, key=lambda sv: (sv[1], -sv[0]))[0]}
    out["unseen_drop_from_peak"] = out["unseen_peak"] - trained[-1][1]
    start = [v for s, v in un if s == 0]
    if start:
        out["unseen_start"] = start[0]
        out["unseen_peak_over_start"] = out["unseen_peak"] - start[0]
    return out


def group_name(flag: Any) -> str:
    return "control" if flag == "control" else "seen" if flag else "unseen"


def group(r: dict[str, Any], which: str) -> list[str]:
    """The simulators of a run's panel in a group: ``seen``, ``unseen``, ``all`` (both), ``control``, or the
    unseen ones of a training simulator's model family (``unseen_same_family``) or of another
    (``unseen_other_family``)."""
    flags = r.get("seen_flags", {})
    if which == "control":
        return [k for k, v in flags.items() if v == "control"]
    if which in ("unseen_same_family", "unseen_other_family"):
        fams = r.get("families", {})
        same = which == "unseen_same_family"
        return [k for k in group(r, "unseen") if k in fams and fams[k][1] == same]
    return [k for k, v in flags.items() if v != "control" and (which == "all" or v == (which == "seen"))]


def cells_at(r: dict[str, Any], step: Any) -> Cells | None:
    """A run's evaluation at ``step`` (None where it has none)."""
    return r.get("cells", {}).get(str(step)) if step is not None else None
