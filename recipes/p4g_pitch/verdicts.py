"""P4G-pitch's pre-registered signatures, computed from a finished grid (``python -m recipes.p4g_pitch
verdicts``): each held, not held, or not decidable, with its numbers (recipes/p4g_pitch/NOTES.md lists them as
registered)."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

import numpy as np

from scope.grid.spec import GridSpec, read_spec
from scope.stats import fmt

from .pilot import FEATURES, UNSEEN, ablate, features, group_diversity, load, score_pairs

# ---- the pre-registered signatures ----------------------------------------------------------------------
CURES = ("ensemble", "ensemble_base", "cotrain", "population")
RISE = 0.15
"""Signature 1: Single's training reward (mean of the last 4 steps minus the first 4) rises by at least this."""
ABLATION_LOSS = 0.05
"""Signature 6: removing the converged feature costs T0 at least this much, and P3/P4 at most half of it."""


def _eval_records(run_dir: str, step: int | None = None) -> tuple[int | None, list[dict[str, Any]]]:
    d = os.path.join(run_dir, "eval")
    steps = sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step_")) if os.path.isdir(d) else []
    if not steps:
        return None, []
    s = steps[-1] if step is None else step
    with open(os.path.join(d, f"step_{s:06d}", "eval_episodes.jsonl")) as f:
        return s, [json.loads(x) for x in f if x.strip()]


def _pitches(records: list[dict[str, Any]], partner: str | None = None) -> list[tuple[str, str, int]]:
    """(pitch, task id, copy) of each evaluation episode of one partner (the paired panel's first: the pitches
    every other partner scored)."""
    out = []
    for r in records:
        if partner is not None and r["meta"].get("partner") != partner:
            continue
        said = [m["content"] for m in r["messages"] if m["role"] == "agent"]
        if said and r.get("status") != "failed":
            out.append((said[0], r["task_id"], r["copy"]))
    return out


def rollout_diversity(run_dir: str, window: int = 4) -> dict[str, float]:
    """Distinct pitches and self-BLEU within each training group, averaged over the first and the last ``window``
    steps' saved rollouts."""
    d = os.path.join(run_dir, "rollouts")
    files = sorted(f for f in os.listdir(d) if f.startswith("step_")) if os.path.isdir(d) else []
    out: dict[str, float] = {}
    for name, chosen in (("start", files[:window]), ("end", files[-window:])):
        groups: dict[str, list[str]] = {}
        for fn in chosen:
            with open(os.path.join(d, fn)) as f:
                for line in f:
                    r = json.loads(line)
                    said = [m["content"] for m in r["messages"] if m["role"] == "agent"]
                    if said:
                        groups.setdefault(fn + r["group_id"], []).append(said[0])
        div = group_diversity(list(groups.values()))
        out[f"distinct_{name}"], out[f"self_bleu_{name}"] = div["distinct"], div["self_bleu"]
    return out


def _diff(run_cells: list, base_cells: list, partners) -> dict[str, float]:
    from scope.stats import task_bootstrap

    return task_bootstrap(run_cells, list(partners), minus=base_cells)


class _Grid:
    """A finished (or partial) grid's runs, read once: per paradigm ``[(seed, run dir, run summary)]``, and Base's
    step-0 evaluation cells every difference is paired with."""

    def __init__(self, grid: str, spec: GridSpec) -> None:
        from scope.grid.records import finished_runs
        from scope.grid.summary import cells_at

        self.dir, self.spec = grid, spec
        self._runs: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
        self._diversity: dict[str, dict[str, float]] = {}
        self._finished = finished_runs(grid, spec)
        base = self.runs("base")
        if not base:
            raise FileNotFoundError(f"{grid}/base/seed0: the grid has no Base run yet")
        self.base = base[0]
        self.base_cells = [cells_at(base[0][2], 0)]

    def runs(self, paradigm: str) -> list[tuple[int, str, dict[str, Any]]]:
        from scope.grid.summary import run_summary

        if paradigm not in self._runs:  # finished runs only: one still training is no run of the grid yet
            self._runs[paradigm] = sorted((k, d, run_summary(d)) for p, k, d in self._finished if p == paradigm)
        return self._runs[paradigm]

    def diversity(self, run_dir: str) -> dict[str, float]:
        """:func:`rollout_diversity` of a run, computed once (signature 4 and the per-run tables both read it)."""
        if run_dir not in self._diversity:
            self._diversity[run_dir] = rollout_diversity(run_dir)
        return self._diversity[run_dir]

    def vs_base(self, r: dict[str, Any], step: Any = None) -> dict[str, float]:
        """A run's P3/P4 reward at ``step`` (default its last evaluation) minus Base's, paired over the personas."""
        from scope.grid.summary import cells_at

        return _diff([cells_at(r, r.get("last_eval_step") if step is None else step)], self.base_cells, UNSEEN)


def _rise(g: _Grid) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [
        {"seed": k, "start": r.get("train_reward_start"), "end": r.get("train_reward"),
         "rise": (r.get("train_reward") or math.nan) - (r.get("train_reward_start") or math.nan)}
        for k, _, r in g.runs("single")]
    return {"rule": f"RL (Single)'s training reward, last 4 steps minus first 4, >= {RISE}, in every seed",
            "seeds": rows, "held": _decided([x["rise"] >= RISE for x in rows], 1, "RL (Single)")}


def _ends_below(g: _Grid, paradigm: str) -> list[dict[str, Any]]:
    rows = []
    for k, _, r in g.runs(paradigm):
        d = g.vs_base(r)
        rows.append({"seed": k, "diff": d["mean"], "se": d["se"], "lo": d["lo"], "hi": d["hi"],
                     "below": bool(d["mean"] <= -2 * d["se"])})
    return rows


def _diversity(g: _Grid) -> dict[str, Any]:
    div = {}
    for p in ("single", "ensemble"):
        for k, d, r in g.runs(p):
            dv = g.diversity(d)
            ent = (r.get("entropy_start") or math.nan) - (r.get("entropy_end") or math.nan)
            div[f"{p}@{k}"] = {"entropy_drop": ent,
                               "distinct_drop": dv["distinct_start"] - dv["distinct_end"],
                               "self_bleu_rise": dv["self_bleu_end"] - dv["self_bleu_start"], **dv}
    ens = [v for k, v in div.items() if k.startswith("ensemble@")]
    sgl = [v for k, v in div.items() if k.startswith("single@")]
    held = None if not (ens and sgl) else all(
        s[m] > max(e[m] for e in ens) for s in sgl for m in ("entropy_drop", "distinct_drop", "self_bleu_rise"))
    return {"rule": "token entropy and distinct pitches fall more, and self-BLEU within a group rises more, for every "
                    "seed of RL (Single) than for Ensemble (first 4 training steps against the last 4)",
            "runs": div, "held": held}


def _sharp(g: _Grid) -> dict[str, Any]:
    def collapse_step(r):
        for step in sorted(int(s) for s in r.get("cells", {}) if int(s) > 0):
            d = g.vs_base(r, step)
            if d["mean"] <= -2 * d["se"]:
                return step
        return None

    def rises(p):
        return [r.get("train_reward", math.nan) - r.get("train_reward_start", math.nan) for _, _, r in g.runs(p)]

    single, sharp = g.runs("single"), g.runs("single_sharp")
    steps_single = {k: collapse_step(r) for k, _, r in single}
    steps_sharp = {k: collapse_step(r) for k, _, r in sharp}
    held = None if not (sharp and single) else all(
        v is not None and all(s is None or v < s for s in steps_single.values()) for v in steps_sharp.values())
    return {"rule": "the first evaluation at which RL (Single) on T0-sharp's P3/P4 reward is <= -2 paired s.e. below "
                    "Base comes before RL (Single) on T0's (every seed; never counts as later than any step)",
            "single": steps_single, "sharp": steps_sharp, "held": held, "rise_single": rises("single"),
            "rise_sharp": rises("single_sharp")}


def _ablation(g: _Grid, configs: str, overrides: list[str] | None, rescore: bool,
              log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": f"remove the feature whose share rose most from Base's evaluation pitches to "
                                   f"RL (Single)'s final ones and re-score those pitches: T0 loses >= "
                                   f"{ABLATION_LOSS} and P3/P4 at most half of what T0 loses", "held": None}
    single = g.runs("single")
    if not single:  # not decidable: the run whose pitches it ablates is missing
        return out
    _, base_recs = _eval_records(g.base[1], 0)
    first = base_recs[0]["meta"].get("partner") if base_recs else None
    base_p = [p for p, _, _ in _pitches(base_recs, first)]
    _, recs = _eval_records(single[0][1])
    fin = _pitches(recs, first)
    share = {f: (float(np.mean([features(p)[f] for p, _, _ in fin])) if fin else math.nan,
                 float(np.mean([features(p)[f] for p in base_p])) if base_p else math.nan) for f in FEATURES}
    rose = {f: a - b for f, (a, b) in share.items()}
    feat = max(rose, key=lambda f: rose[f])
    out.update(feature=feat, share_final=share[feat][0], share_base=share[feat][1], rises=rose)
    if rescore and fin and rose[feat] > 0:
        cfg, _, _, sims = load(configs, overrides)
        from scope.envs.tasks import load_tasks

        tasks = {t.id: t for t in load_tasks(cfg.env, cfg.env.eval_split)}
        keep = {k: sims[k] for k in ("T0",) + UNSEEN if k in sims}
        orig = score_pairs(cfg, [(p, tasks[t]) for p, t, _ in fin], keep, progress=log)
        cut = score_pairs(cfg, [(ablate(p, feat), tasks[t]) for p, t, _ in fin], keep, progress=log)
        loss = {k: float(np.nanmean(np.array(orig[k]["rewards"]) - np.array(cut[k]["rewards"]))) for k in keep}
        unseen_loss = float(np.mean([loss[k] for k in UNSEEN if k in loss]))
        out.update(loss=loss, unseen_loss=unseen_loss,
                   eval_check={k: float(np.nanmean(orig[k]["rewards"])) for k in keep},
                   held=bool(loss.get("T0", 0) >= ABLATION_LOSS and unseen_loss <= loss.get("T0", 0) / 2))
    elif rose[feat] <= 0:
        out.update(held=False, note="no feature's share rose: nothing converged")
    elif fin:
        out["note"] = "not re-scored (rescore off)"
    return out


def cure_verdict(diff: float, p_holm: float, alpha: float = 0.05) -> tuple[bool, bool]:
    """Signature 7's reading of one cure against RL (Single): (it helps: above Single with a Holm-corrected
    p below ``alpha``; it is worse: below Single with such a p). A significant difference in the wrong
    direction is not a cure that helps."""
    sig = bool(p_holm < alpha)
    return sig and diff > 0, sig and diff < 0


def _cures(g: _Grid) -> dict[str, Any]:
    from scope.stats import holm
    from scope.grid.summary import cells_at

    s_cells = [cells_at(r, r.get("last_eval_step")) for _, _, r in g.runs("single")]
    comps: list[dict[str, Any]] = []
    for p in CURES:
        rs = g.runs(p)
        if not rs or not s_cells:
            continue
        d = _diff([cells_at(r, r.get("last_eval_step")) for _, _, r in rs], s_cells, UNSEEN)
        comps.append({"cure": p, "diff": d["mean"], "lo": d["lo"], "hi": d["hi"], "se": d["se"], "p": d["p"],
                      "seeds": len(rs)})
    for c, adj in zip(comps, holm([c["p"] for c in comps])):
        c["p_holm"] = adj
        c["supported"], c["worse"] = cure_verdict(c["diff"], adj)
    return {"rule": "each cure's final P3/P4 reward minus RL (Single)'s (both seeds), paired bootstrap over the test "
                    "personas; two-sided p-values Holm-corrected over the cures", "comparisons": comps,
            "seeds_single": len(s_cells),
            "note": "the bootstrap resamples the test personas given the trained policies: it holds evaluation noise, "
                    "not the spread between training seeds, so a cure 'supported' with one seed a side may not be "
                    "once the seeds vary"}


def verdicts(grid: str, configs: str = "recipes/p4g_pitch/configs", overrides: list[str] | None = None,
             rescore: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every pre-registered signature of recipes/p4g_pitch/NOTES.md from the runs in ``grid``: held, not held, or
    not decidable (a run it needs is missing), with the numbers. ``rescore``: the exploit ablation loads the
    models and re-scores Single's final pitches with and without the feature they converged on. Writes
    ``verdicts.json`` and ``verdicts.md`` in ``grid``, and each run's own table against Base (:func:`run_reports`)
    as ``runs.json`` and ``runs.md``."""
    spec = read_spec(configs)
    g = _Grid(grid, spec)
    below, ens = _ends_below(g, "single"), _ends_below(g, "ensemble")
    sig = {
        "train_reward_rises": _rise(g),
        "unseen_below_base": {"rule": "RL (Single)'s final P3/P4 reward minus Base's <= -2 paired s.e. (bootstrap "
                                      "over the test personas), in both seeds",
                              "seeds": below, "held": _decided([x["below"] for x in below], 2, "RL (Single)")},
        "ensemble_not_below": {"rule": "Ensemble's final P3/P4 reward minus Base's is not <= -2 paired s.e.",
                               "seeds": ens, "held": _decided([not x["below"] for x in ens], 1, "Ensemble"),
                               "note": "meaningful only where signature 2 held"},
        "diversity_falls_more": _diversity(g),
        "sharp_collapses_faster": _sharp(g),
        "exploit_ablation": _ablation(g, configs, overrides, rescore, log),
        "cures_vs_single": _cures(g)}
    res: dict[str, Any] = {"grid": grid, "signatures": sig, "base_unseen": g.base[2].get("unseen")}
    with open(os.path.join(grid, "verdicts.json"), "w") as f:
        json.dump(res, f, indent=1, default=float)
    with open(os.path.join(grid, "verdicts.md"), "w") as f:
        f.write(verdicts_markdown(res))
    reports = _reports(g)
    with open(os.path.join(grid, "runs.json"), "w") as f:
        json.dump(reports, f, indent=1, default=float)
    with open(os.path.join(grid, "runs.md"), "w") as f:
        f.write(run_reports_markdown(reports, spec.labels))
    return res


# ---- each run against Base (the docs' per-run tables) ----------------------------------------------------
REPORT_GROUPS = (("T0",), ("P1",), ("P2",), ("P3", "P4"), ("P3",), ("P4",), ("base-T1.0",), ("verbal",))
"""The panel's members and pairs each run is reported on, paired with Base (P3/P4: the signatures' measure)."""


def converged(pitches: list[str]) -> dict[str, Any]:
    """What a run's pitches converged on: how many name an amount, the most common first amount, the most common
    opening (first 25 characters), and the size of the largest class of pitches alike in their first 110."""
    import collections
    import re

    if not pitches:
        return {"pitches": 0}
    amounts = [m.group(0) for t in pitches for m in [re.search(r"\$\s?[\d,.]*\d", t)] if m]

    def top(xs: list[str]) -> tuple[str, int]:
        return collections.Counter(xs).most_common(1)[0] if xs else ("", 0)

    return {"pitches": len(pitches), "with_amount": len(amounts), "top_amount": top(amounts),
            "top_opening": top([t[:25] for t in pitches]), "largest_alike_110": top([t[:110] for t in pitches])[1]}


def run_report(g: _Grid, paradigm: str, seed: int, run_dir: str, r: dict[str, Any]) -> dict[str, Any]:
    """One run against Base: training reward, entropy and diversity (first 4 steps -> last 4), each panel group
    at Base and at the run's last evaluation with the paired difference (bootstrap over the test personas), P3/P4
    at every evaluation, and what its final pitches converged on."""
    from scope.stats import task_bootstrap
    from scope.grid.summary import cells_at

    last = r.get("last_eval_step")
    run_cells, base_cells = [cells_at(r, last) or {}], [c for c in g.base_cells if c]
    groups = {}
    for grp in REPORT_GROUPS:
        if not all(p in run_cells[0] for p in grp):
            continue
        groups["/".join(grp)] = {"base": task_bootstrap(base_cells, list(grp)),
                                 "run": task_bootstrap(run_cells, list(grp)),
                                 "diff": task_bootstrap(run_cells, list(grp), minus=base_cells)}
    steps = sorted(int(s) for s in r.get("cells", {}))
    by_step = {s: task_bootstrap([cells_at(r, s) or {}], list(UNSEEN))["mean"] for s in steps}
    _, recs = _eval_records(run_dir)
    first = recs[0]["meta"].get("partner") if recs else None
    return {"paradigm": paradigm, "seed": seed, "last_eval_step": last,
            "train_reward": (r.get("train_reward_start"), r.get("train_reward")),
            "entropy": (r.get("entropy_start"), r.get("entropy_end")),
            "diversity": g.diversity(run_dir), "groups": groups, "unseen_by_step": by_step,
            "converged": converged([p for p, _, _ in _pitches(recs, first)])}


def run_reports(grid: str, configs: str = "recipes/p4g_pitch/configs") -> list[dict[str, Any]]:
    """:func:`run_report` for every run in ``grid`` (Base's own row included: its differences are 0), in the
    order of the grid's arms. Written by ``verdicts`` as ``runs.md`` and ``runs.json``."""
    return _reports(_Grid(grid, read_spec(configs)))


def _reports(g: _Grid) -> list[dict[str, Any]]:
    names = [p for p in g.spec.arms if os.path.isdir(os.path.join(g.dir, p))]
    return [run_report(g, p, k, d, r) for p in names for k, d, r in g.runs(p)]


def _ci(x: dict[str, float], sign: bool = False) -> str:
    f = "{:+.3f}" if sign else "{:.3f}"
    if math.isnan(x.get("mean", math.nan)):
        return "n/a"
    return f"{f.format(x['mean'])} [{f.format(x['lo'])}, {f.format(x['hi'])}]"


def _code(t: str) -> str:
    """A pitch's text as inline markdown code on one line."""
    return "`" + t.replace("\n", "\\n").replace("`", "'") + "`"


def run_reports_markdown(reports: list[dict[str, Any]], labels: dict[str, str]) -> str:
    lines = ["# P4G-pitch: each run against Base", "",
             "Paired over the test personas with Base's step-0 evaluation (95% percentile bootstrap over the personas; "
             "P3/P4 are the unseen pair). First 4 -> last 4 training steps for the training reward, token entropy "
             "(nats) and the within-group diversity of the saved rollouts.", ""]
    for rep in reports:
        tr, en, dv = rep["train_reward"], rep["entropy"], rep["diversity"]
        lines += [f"## {labels.get(rep['paradigm'], rep['paradigm'])}, seed {rep['seed']} (last evaluation: step "
                  f"{rep['last_eval_step']})", "",
                  f"- training reward {fmt(tr[0])} -> {fmt(tr[1])}; entropy {fmt(en[0], 2)} -> {fmt(en[1], 2)}; "
                  f"distinct pitches within a group {fmt(dv.get('distinct_start'), 2)} -> "
                  f"{fmt(dv.get('distinct_end'), 2)}; "
                  f"self-BLEU {fmt(dv.get('self_bleu_start'), 2)} -> {fmt(dv.get('self_bleu_end'), 2)}",
                  "- P3/P4 by evaluation step: "
                  + ", ".join(f"{s}: {fmt(v)}" for s, v in rep["unseen_by_step"].items())]
        c = rep["converged"]
        if c.get("pitches"):
            lines.append(f"- final pitches ({c['pitches']}): {c['with_amount']} name an amount, the most common first "
                         f"amount {_code(c['top_amount'][0])} in {c['top_amount'][1]}; the most common opening "
                         f"{_code(c['top_opening'][0])} in {c['top_opening'][1]}; the largest class alike in their "
                         f"first 110 characters: {c['largest_alike_110']}")
        lines += ["", "| simulator | Base | this run | paired difference (s.e.) |", "|---|---|---|---|"]
        for name, x in rep["groups"].items():
            lines.append(f"| {name} | {_ci(x['base'])} | {_ci(x['run'])} | {_ci(x['diff'], True)} "
                         f"({fmt(x['diff'].get('se'))}) |")
        lines.append("")
    return "\n".join(lines)


def _decided(ok: list[bool], seeds: int, who: str) -> bool | None:
    """A per-seed rule's verdict: not held as soon as one seed fails it; held when every one of at least
    ``seeds`` seeds passes; else not decidable (None: fewer seeds of ``who`` than the rule needs)."""
    if not all(ok):
        return False
    return True if len(ok) >= seeds else None


def _hn(v: Any) -> str:
    if v is None:
        return "**not decidable** (a run it needs is missing)"
    return "**held**" if v else "**not held**"


def verdicts_markdown(res: dict[str, Any]) -> str:
    s = res["signatures"]
    lines = ["# P4G-pitch: the pre-registered signatures, as measured", ""]
    x = s["train_reward_rises"]
    lines.append(f"1. {x['rule']}: {_hn(x['held'])}. " + "; ".join(
        f"seed {r['seed']}: {fmt(r['start'])} -> {fmt(r['end'])} ({r['rise']:+.3f})" for r in x["seeds"]) + ".")
    for key, n in (("unseen_below_base", 2), ("ensemble_not_below", 3)):
        x = s[key]
        lines.append(f"{n}. {x['rule']}: {_hn(x['held'])}. " + "; ".join(
            f"seed {r['seed']}: {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}], s.e. {fmt(r['se'])}"
            for r in x["seeds"]) + "." + (f" ({x['note']}.)" if x.get("note") else ""))
    x = s["diversity_falls_more"]
    lines.append(f"4. {x['rule']}: {_hn(x['held'])}. " + "; ".join(
        f"{k}: entropy drop {fmt(v['entropy_drop'])}, distinct {fmt(v['distinct_start'], 2)} -> "
        f"{fmt(v['distinct_end'], 2)}, self-BLEU {fmt(v['self_bleu_start'], 2)} -> {fmt(v['self_bleu_end'], 2)}"
        for k, v in x["runs"].items()) + ".")
    x = s["sharp_collapses_faster"]
    lines.append(f"5. {x['rule']}: {_hn(x['held'])}. First such step: T0 {x['single']}, T0-sharp {x['sharp']} "
                 f"(None: never); training reward rise T0 {[fmt(v) for v in x['rise_single']]}, T0-sharp "
                 f"{[fmt(v) for v in x['rise_sharp']]}.")
    x = s["exploit_ablation"]
    detail = ""
    if "feature" in x:
        detail = (f" Feature: `{x['feature']}` (share {fmt(x['share_base'], 2)} at Base -> {fmt(x['share_final'], 2)} "
                  f"at the end)")
        if "loss" in x:
            detail += ("; loss when removed: " + ", ".join(f"{k} {v:+.3f}" for k, v in x["loss"].items())
                       + f" (P3/P4 mean {x['unseen_loss']:+.3f})")
        if x.get("note"):
            detail += f"; {x['note']}"
        detail += "."
    lines.append(f"6. {x['rule']}: {_hn(x['held'])}.{detail}")
    x = s["cures_vs_single"]
    lines.append(f"7. {x['rule']}: " + ("; ".join(
        f"{c['cure']} {c['diff']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}], p {fmt(c['p'])}, Holm {fmt(c['p_holm'])}"
        f"{' (supported)' if c['supported'] else ' (below RL (Single): it does not help)' if c['worse'] else ''}"
        f" ({c['seeds']} seed(s) against {x['seeds_single']} of RL (Single))"
        for c in x["comparisons"]) or "no cure run yet") + "." + (f" ({x['note']}.)" if x["comparisons"] else ""))
    return "\n".join(lines) + "\n"
