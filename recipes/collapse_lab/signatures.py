"""The collapse signatures of a grid (a section hook of ``grid.yaml``): RL (Single)'s training reward, its unseen
peak tested against Base and its fall from it, where it ends against Base, and each cure's margin over Single
on the unseen simulators with its paired interval, and which orderings among the cures the numbers support.

The collapse lab and P4G-mini name it in their ``grid.yaml``; it reads the arms ``single`` (RL against the one
training simulator) and ``base`` (the policy as built), and takes every other arm for a cure."""
from __future__ import annotations

import math
from typing import Any

from scope.grid.spec import GridSpec, Section
from scope.grid.summary import cells_at, group
from scope.stats import exceeds, fmt, spread, task_bootstrap

SINGLE, BASE = "single", "base"


def peak_test(r: dict[str, Any]) -> dict[str, Any]:
    """Single's unseen peak (its best trained evaluation) against Base (its own step-0 evaluation), paired
    over the tasks: the difference, its bootstrap s.e. and interval, and whether it exceeds two s.e.
    ("peaks" is written only then). The peak is the maximum of several noisy evaluations, so two s.e. is
    a lenient bar; the test is one-sided at the chosen step. Also the final evaluation against Base."""
    unseen = group(r, "unseen")
    base, peak, end = cells_at(r, 0), cells_at(r, r.get("unseen_peak_step")), cells_at(r, r.get("last_eval_step"))
    if base is None or peak is None or end is None or not unseen:
        return {}
    d = task_bootstrap([peak], unseen, minus=[base])
    e = task_bootstrap([end], unseen, minus=[base])
    return {"peak_step": r["unseen_peak_step"], "peak_minus_base": d, "peaks": exceeds(d),
            "end_minus_base": e, "ends_below_base": bool(e["hi"] < 0)}


def signatures(summary: dict[str, dict], runs: dict[str, list]) -> dict[str, Any]:
    """RL (Single)'s collapse signatures per seed, each cure's margin over Single on the unseen simulators with
    its paired interval, and which orderings among the cures the numbers support (the thresholds the lab's
    checks assert). Entropy and zero-variance are reported in the table, not here: they fall and climb under
    every paradigm of the lab."""
    out: dict[str, Any] = {}
    single = runs.get(SINGLE) or []
    if not single:
        return out
    out["single"] = [_seed(r) for r in single]
    s_unseen = summary[SINGLE]["unseen"]
    cures = [p for p in summary if p not in (SINGLE, BASE)]
    out["cure_margin_unseen"] = {p: summary[p]["unseen"] - s_unseen for p in cures}
    out["cure_ranking_unseen"] = sorted(cures, key=lambda p: -out["cure_margin_unseen"][p])

    def final(p):
        rs = runs.get(p) or []
        return [c for r in rs if (c := cells_at(r, r.get("last_eval_step"))) is not None], \
            (group(rs[0], "unseen") if rs else [])

    s_cells, unseen = final(SINGLE)
    out["cure_margin_interval"] = {}
    for p in cures:
        c, _ = final(p)
        if c and s_cells and unseen:
            b = task_bootstrap(c, unseen, minus=s_cells)
            out["cure_margin_interval"][p] = [b["lo"], b["hi"]]
    # an ordering a > b is supported only if the paired interval of a - b (evaluation noise) excludes 0 and
    # every seed of a ends above every seed of b (the seeds' spread, which the interval does not hold)
    supported = []
    for a in cures:
        for o in cures:
            ca, co = final(a)[0], final(o)[0]
            if a == o or len(ca) < 2 or len(co) < 2:
                continue
            d = task_bootstrap(ca, unseen, minus=co, resamples=1000)
            if d["lo"] > 0 and spread(summary[a]["unseen_seeds"])[0] > spread(summary[o]["unseen_seeds"])[1]:
                supported.append([a, o])
    out["cure_orderings_supported"] = supported
    return out


def _seed(r: dict[str, Any]) -> dict[str, Any]:
    t = peak_test(r)
    return {"train_reward": r.get("train_reward"), "unseen_drop_from_peak": r.get("unseen_drop_from_peak"),
            "unseen_peak_over_start": r.get("unseen_peak_over_start"), "peak_step": t.get("peak_step"),
            "peak_minus_base_se": t.get("peak_minus_base", {}).get("se"), "peaks": t.get("peaks"),
            "end_minus_base": t.get("end_minus_base", {}).get("mean"),
            "end_minus_base_lo": t.get("end_minus_base", {}).get("lo"),
            "end_minus_base_hi": t.get("end_minus_base", {}).get("hi"), "ends_below_base": t.get("ends_below_base")}


def lines(sig: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """The table's lines on the signatures: Single per seed, the cures' margins, the supported orderings."""
    if not sig.get("single"):
        return []
    out = ["RL (Single), per seed: " + "; ".join(
        f"training reward {fmt(x['train_reward'], 2)}; unseen peak (step {x['peak_step']}) minus Base "
        f"{fmt(x['unseen_peak_over_start'], 3)} (2 s.e. = {fmt(2 * (x['peak_minus_base_se'] or math.nan), 3)}: "
        f"{'a peak' if x['peaks'] else 'not a peak, within the noise'}), then a drop of "
        f"{fmt(x['unseen_drop_from_peak'], 3)}; the end minus Base {fmt(x['end_minus_base'], 3)} "
        f"[{fmt(x['end_minus_base_lo'], 3)}, {fmt(x['end_minus_base_hi'], 3)}]"
        f"{' (below Base)' if x['ends_below_base'] else ''}" for x in sig["single"]) + "."]
    iv = sig.get("cure_margin_interval", {})
    out += ["", "Margin over RL (Single) on the unseen simulators (95% paired interval over the tasks): " + ", ".join(
        f"{labels[p]} {sig['cure_margin_unseen'][p]:+.3f}" + (f" [{iv[p][0]:+.3f}, {iv[p][1]:+.3f}]" if p in iv else "")
        for p in sig["cure_ranking_unseen"]) + "."]
    sup = sig.get("cure_orderings_supported", [])
    out += ["", ("Orderings among the cures that the numbers support (paired interval above 0 and every "
                 "seed above every seed): " + ", ".join(f"{labels[a]} > {labels[b]}" for a, b in sup) + ".")
            if sup else
            "No ordering among the cures is supported (none has a paired interval above 0 together with every "
            "seed above every seed of the other): the margins above are not a ranking."]
    return out


def section(results: dict[str, Any], spec: GridSpec) -> Section:
    """The grid hook: ``results["signatures"]`` and its lines below the table."""
    sig = signatures(results["arms"], results["runs"])
    return Section("signatures", sig, lines(sig, spec.labels))
