"""``scope study analyze DB``: per-condition means with bootstrap CIs, the pre-registered tests with
Holm-Bonferroni, derived measures, a markdown report, PNG plots and CSV exports.

Outcomes per session (only sessions whose chat ended are analysed; ``finished`` counts the survey):

- tau2: ``reward`` (recomputed here by replaying the stored turns in the environment and grading them
  with the project's tau2 evaluator), ``task_success`` (reward 1, binary), ``satisfaction`` (mean of
  the eight Likert items, frustration reverse-coded), each item, ``user_turns``, ``goal_abandoned``
  (binary: the participant ended the chat and the task was not achieved), ``transferred`` (binary);
- P4G: ``donation`` (survey, dollars in [0, 2]), ``experience`` (mean of the five Likert items,
  manipulation reverse-coded), each item, ``agent_turns``, ``donation_asks`` (agent messages that ask
  for a donation: they mention donating, giving or contributing).

Tests: Welch's t (unequal variances) for continuous and Likert outcomes, Fisher's exact (two-sided)
for binary ones; Holm-Bonferroni over every pre-registered (comparison x outcome) test of a task type.
CIs: percentile bootstrap of the mean (10,000 resamples by default, seeded).
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np

from . import store
from ..stats import bootstrap_ci, fisher, fmt, holm, welch
from .config import kind_of
from .survey import composite, items

BINARY = {"task_success", "goal_abandoned", "transferred", "finished"}
DEFAULT_OUTCOMES = {"tau2": ["task_success", "reward", "satisfaction"], "p4g": ["donation", "experience"],
                    "koth": ["humanlike", "believability"]}
_ASK = re.compile(r"\b(donat\w*|give|giving|contribut\w*|chip in|spare)\b", re.IGNORECASE)


# ---- outcomes from the database ---------------------------------------------------------------------
def tau2_grade(sess: store.StudySession, turns: list[store.Turn]) -> dict[str, Any]:
    """Replay the stored turns in a fresh tau2 environment and grade them as training does."""
    import random

    from ..envs.base import get_env
    from .service import replay

    env_cls = get_env(sess.env)
    opts = json.loads(sess.env_options or "{}")
    opts = {k: v for k, v in opts.items() if k in env_cls.option_names()}
    tasks = {t.id: t for t in env_cls.load_tasks("all", **opts)}
    env = env_cls(tasks[sess.task_id], random.Random(0), **opts)
    replay(env, turns)
    r = env.rewards()["agent"]
    return {"reward": float(r), "evaluation": env.meta.get("evaluation")}


def session_outcomes(sess: store.StudySession, turns: list[store.Turn], survey: store.Survey | None
                     ) -> dict[str, Any]:
    kind = kind_of(sess.env)
    o: dict[str, Any] = {"session": sess.id, "condition": sess.condition, "task_type": sess.task_type,
                         "kind": kind, "task_id": sess.task_id, "end_reason": sess.end_reason,
                         "finished": 1.0 if survey is not None else 0.0, "user_turns": sess.user_turns}
    answers = json.loads(survey.answers) if survey is not None else None
    agent_msgs = [t.content for t in turns if t.role == "agent" and t.visible]
    if kind == "tau2":
        g = tau2_grade(sess, turns)
        o["reward"] = g["reward"]
        o["task_success"] = 1.0 if g["reward"] >= 1.0 else 0.0
        o["transferred"] = 1.0 if sess.end_reason == "transfer" else 0.0
        o["goal_abandoned"] = 1.0 if sess.end_reason == "participant" and g["reward"] < 1.0 else 0.0
        if answers:
            o["satisfaction"] = composite("tau2", answers)
    elif kind == "koth":
        rec = next((t for t in turns if t.kind == "replay"), None)
        if rec is not None:
            meta = json.loads(rec.meta)
            o["result"] = float(meta["result"])
            o["score_share"] = meta["score"][0] / max(1, sum(meta["score"]))
        if answers:
            o["believability"] = composite("koth", answers)
    else:
        o["agent_turns"] = len(agent_msgs)
        o["donation_asks"] = sum(bool(_ASK.search(m)) for m in agent_msgs)
        if answers:
            o["donation"] = answers["donation"]
            o["experience"] = composite("p4g", answers)
    if answers:
        for it in items(kind):
            o[it["id"]] = answers[it["id"]]
    return o


def collect(engine) -> list[dict[str, Any]]:
    sessions, turns, surveys = store.all_rows(engine)
    by_sess: dict[str, list[store.Turn]] = {}
    for t in turns:
        by_sess.setdefault(t.session_id, []).append(t)
    sv = {s.session_id: s for s in surveys}
    return [session_outcomes(s, by_sess.get(s.id, []), sv.get(s.id)) for s in sessions if s.status != "active"]


def outcome_names(kind: str) -> list[str]:
    if kind == "tau2":
        base = ["reward", "task_success", "satisfaction", "user_turns", "goal_abandoned", "transferred"]
    elif kind == "koth":
        base = ["believability", "result", "score_share"]
    else:
        base = ["donation", "experience", "agent_turns", "donation_asks", "user_turns"]
    return base + [i["id"] for i in items(kind)] + ["finished"]


def analyze(rows: list[dict[str, Any]], conditions: list[str], comparisons: list[tuple[str, str]],
            outcomes: list[str] | None = None, resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Summaries and tests per task type. ``outcomes``: the pre-registered ones (default per kind)."""
    res: dict[str, Any] = {"task_types": {}}
    for tt in sorted({r["task_type"] for r in rows}):
        rs = [r for r in rows if r["task_type"] == tt]
        kind = rs[0]["kind"]
        names = outcome_names(kind)
        pre = [o for o in (outcomes or DEFAULT_OUTCOMES[kind]) if o in names]
        summary: dict[str, dict[str, Any]] = {}
        for c in conditions:
            summary[c] = {}
            for o in names:
                xs = [float(r[o]) for r in rs if r["condition"] == c and r.get(o) is not None]
                lo, hi = bootstrap_ci(xs, resamples, seed)
                summary[c][o] = {"mean": float(np.mean(xs)) if xs else float("nan"), "ci": [lo, hi], "n": len(xs)}
        tests: list[dict[str, Any]] = []
        for a, b in comparisons:
            for o in names:
                xa = [float(r[o]) for r in rs if r["condition"] == a and r.get(o) is not None]
                xb = [float(r[o]) for r in rs if r["condition"] == b and r.get(o) is not None]
                t = fisher(xa, xb) | {"test": "fisher"} if o in BINARY else welch(xa, xb) | {"test": "welch"}
                diff = (float(np.mean(xa)) - float(np.mean(xb))) if xa and xb else float("nan")
                tests.append({"outcome": o, "a": a, "b": b, "diff": diff, "n_a": len(xa), "n_b": len(xb),
                              "preregistered": o in pre} | t)
        pre_tests = [t for t in tests if t["preregistered"]]
        for t, p in zip(pre_tests, holm([t["p"] for t in pre_tests])):
            t["p_holm"] = p
        res["task_types"][tt] = {"kind": kind, "n_sessions": len(rs), "summary": summary, "tests": tests,
                                 "preregistered": pre}
    return res


# ---- report ---------------------------------------------------------------------------------------------
def markdown(res: dict[str, Any], conditions: list[str]) -> str:
    lines = ["# Human study: results", ""]
    for tt, r in res["task_types"].items():
        lines += [f"## {tt} ({r['kind']}, {r['n_sessions']} ended sessions)", "",
                  "Means with 95% bootstrap CIs (n):", "",
                  "| outcome | " + " | ".join(conditions) + " |", "|---|" + "---|" * len(conditions)]
        for o in outcome_names(r["kind"]):
            cells = []
            for c in conditions:
                s = r["summary"][c][o]
                cells.append(f"{fmt(s['mean'])} [{fmt(s['ci'][0])}, {fmt(s['ci'][1])}] ({s['n']})")
            lines.append(f"| {o}{' *' if o in r['preregistered'] else ''} | " + " | ".join(cells) + " |")
        lines += ["", "\\* pre-registered. Tests (Welch's t; Fisher's exact for binary outcomes); Holm-Bonferroni "
                  "over the pre-registered ones:", "",
                  "| outcome | comparison | diff | test | statistic | p | p (Holm) |", "|---|---|---|---|---|---|---|"]
        for t in sorted(r["tests"], key=lambda t: (not t["preregistered"], t["outcome"])):
            stat = (f"t={fmt(t['t'], 2)}, df={fmt(t['df'], 1)}" if t["test"] == "welch"
                    else f"OR={fmt(t['odds_ratio'], 2)}")
            lines.append(f"| {t['outcome']} | {t['a']} vs {t['b']} | {fmt(t['diff'])} | {t['test']} | {stat} | "
                         f"{fmt(t['p'], 4)} | {fmt(t.get('p_holm', float('nan')), 4)} |")
        lines.append("")
    return "\n".join(lines)


def plots(res: dict[str, Any], conditions: list[str], out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for tt, r in res["task_types"].items():
        pre = r["preregistered"]
        fig, axes = plt.subplots(1, len(pre), figsize=(4 * len(pre), 3.5), squeeze=False)
        for ax, o in zip(axes[0], pre):
            ms = [r["summary"][c][o]["mean"] for c in conditions]
            lo = [m - r["summary"][c][o]["ci"][0] for m, c in zip(ms, conditions)]
            hi = [r["summary"][c][o]["ci"][1] - m for m, c in zip(ms, conditions)]
            ax.bar(range(len(conditions)), [0 if math.isnan(m) else m for m in ms],
                   yerr=[[0 if math.isnan(x) else x for x in lo], [0 if math.isnan(x) else x for x in hi]], capsize=4)
            ax.set_xticks(range(len(conditions)), conditions, rotation=20)
            ax.set_title(o)
        fig.suptitle(f"{tt}: means and 95% bootstrap CIs")
        fig.tight_layout()
        p = os.path.join(out, f"{tt}.png")
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths


def run(db: str, out: str, conditions: list[str] | None = None, comparisons: list[tuple[str, str]] | None = None,
        outcomes: list[str] | None = None, resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Analyse the study database ``db`` (a path to a SQLite file or an SQLAlchemy URL) into ``out``."""
    url = db if "://" in db else f"sqlite:///{os.path.abspath(db)}"
    if "://" not in db and not os.path.exists(db):
        raise FileNotFoundError(f"study database {db} not found")
    eng = store.make_engine(url)
    rows = collect(eng)
    if not rows:
        raise ValueError(f"{db}: no ended sessions to analyse")
    conditions = conditions or sorted({r["condition"] for r in rows})
    comparisons = comparisons or [(c, conditions[0]) for c in conditions[1:]]
    res = analyze(rows, conditions, comparisons, outcomes, resamples, seed)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "analysis.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(res, conditions))
    plots(res, conditions, out)
    for t in store.EXPORTS:
        with open(os.path.join(out, f"{t}.csv"), "w") as f:
            f.write(store.csv_text(eng, t))
    cols = sorted({k for r in rows for k in r})
    import csv

    with open(os.path.join(out, "outcomes.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: store.safe_cell(v) for k, v in r.items()})
    return res
