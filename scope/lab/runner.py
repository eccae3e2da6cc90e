"""``scope lab``: the collapse lab's grid of paradigms x seeds, through ``scope train``'s own loop.

Each paradigm is a config in ``configs/lab/`` (they extend ``common.yaml``); each run is an ordinary
training run in ``OUT/<paradigm>/seed<k>/`` with its held-out panel evaluated every ``eval.every``
steps and at step 0. Base is the untrained agent, evaluated on the same panel. A finished run is not
run again, so an interrupted grid continues where it stopped. At the end the grid writes:

- ``results.json``: per run, the final panel scores and the curves; per paradigm, means and stds;
- ``table.md``: a Table-1-style table (held-out reward on seen / unseen / all simulators with their
  task-bootstrap intervals and each seed's value), the training reward (last 4 steps) and the collapse
  signatures;
- ``curves.png`` (and one PNG per panel): Figure-3-style curves per paradigm, averaged over seeds:
  training reward, held-out reward on the unseen simulators, policy entropy, zero-variance group
  fraction and the simulator's behaviour modal mass.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable

from ..run import eta
from .records import finished as _finished
from ..stats import TRAIN_WINDOW, Cells, window

PARADIGMS = ("base", "single", "ensemble", "single_sharp", "ensemble_base", "single_p1", "persona",
             "persona_evolved", "vs", "cotrain", "population")
"""Every paradigm the grid knows; a grid runs those of them that have a config in its directory
(``persona_evolved``: the persona paradigm with evolved personas, in ``configs/p4g_mini`` only;
``single_sharp``, ``ensemble_base``, ``single_p1``: P4G-pitch's, in ``configs/p4g_pitch``)."""
LABELS = {"base": "Base", "single": "RL (Single)", "ensemble": "Ensemble", "persona": "Persona",
          "persona_evolved": "Persona (evolved)", "single_sharp": "RL (Single) on T0-sharp",
          "ensemble_base": "Ensemble (base variants)", "single_p1": "RL (Single) on P1",
          "vs": "Verbalized Sampling", "cotrain": "Co-Training", "population": "Population Co-Training"}
PLAN = "grid.yaml"
"""A grid directory may fix its runs and their order in this file: ``runs: [base, single, single@1, ...]``
(a paradigm, or ``paradigm@seed``; no seed means seed 0). Without it, every paradigm runs for seeds 0..n-1."""
QUICK: dict[str, Any] = {"seeds": 1, "overrides": ["train.steps=20", "eval.every=5"]}
"""``--quick``: one seed and half the steps (the CI run and the demo)."""
CURVES = [("reward_mean", "training reward"), ("eval/unseen_mean", "held-out reward (unseen simulators)"),
          ("policy_entropy", "policy entropy (nats/token)"), ("zero_variance_frac", "zero-variance group fraction"),
          ("partner_behaviour/modal_mass", "simulator behaviour modal mass")]


def evaluate_untrained(cfg, log: Callable[[str], None]) -> None:
    """Base: the agent as built, on the panel, written as the step-0 line of a run directory."""
    from ..run import MetricsLogger, RunDir
    from ..setup import build_judge, build_models
    from ..monitor import PanelEval
    from ..train import seed_all

    run = RunDir(cfg.run.dir, cfg)
    seed_all(cfg.run.seed)
    if cfg.run.threads:
        import torch

        torch.set_num_threads(cfg.run.threads)
    backends, _, trainable = build_models(cfg)
    evaluator = PanelEval(cfg, backends, trainable["agent"], run, build_judge(cfg, backends))
    m = evaluator.run(0, log)
    logger = MetricsLogger(run, cfg)
    logger.write(0, m)
    logger.close()


def available(configs: str) -> tuple[str, ...]:
    """The paradigms of PARADIGMS that have a config in ``configs`` (Base: the Single config, untrained)."""
    return tuple(p for p in PARADIGMS
                 if os.path.exists(os.path.join(configs, ("single" if p == "base" else p) + ".yaml")))


def run_lab(out: str, configs: str = "configs/lab", paradigms: tuple[str, ...] | None = None, seeds: int = 3,
            overrides: list[str] | None = None, quick: bool = False, log: Callable[[str], None] = print,
            records: str | None = None) -> dict:
    """Run the grid's paradigms x seeds into ``out`` (see the module's docstring). ``records``: a directory of
    run records (:mod:`scope.lab.records`): those missing from ``out`` are restored first and count as done,
    and every run finished here is packed into it as it ends."""
    from ..config import load_config
    from ..train import train

    overrides = list(overrides or [])
    if quick:
        seeds = min(seeds, QUICK["seeds"])
        overrides = QUICK["overrides"] + overrides
    have = available(configs)
    plan = read_plan(configs, have)
    paradigms = (tuple(dict.fromkeys(p for p, _ in plan)) if plan else have) if paradigms is None else paradigms
    unknown = [p for p in paradigms if p not in have]
    if unknown:
        raise ValueError(f"unknown paradigms {unknown}: {configs} has configs for {', '.join(have)}")
    if plan:
        order = [(p, s) for p, s in plan if p in paradigms and s < seeds]
        seeds = max(s for _, s in order) + 1 if order else 1
    else:
        order = [(p, s) for s in range(seeds) for p in paradigms]
    os.makedirs(out, exist_ok=True)
    if records:
        from .records import pack, unpack

        for d in unpack(records, out):
            log(f"lab: restored {d} from {records}")
    t_all = time.time()
    first = load_config(os.path.join(configs, "single.yaml"), overrides)
    if first.run.threads:  # the lab's models are built and its runs trained at the configured thread count
        import torch

        torch.set_num_threads(first.run.threads)
    cards = simulator_cards(out, first, log) if first.env.name == "lab" else {}  # the lab's simulators, measured
    for p, seed in order:
        run_dir = os.path.join(out, p, f"seed{seed}")
        cfg = load_config(os.path.join(configs, ("single" if p == "base" else p) + ".yaml"),
                          overrides + [f"run.seed={seed}", f"run.dir={run_dir}"])
        steps = 0 if p == "base" else cfg.train.steps
        if _finished(run_dir, steps):
            log(f"lab: {LABELS[p]} seed {seed}: done already ({run_dir})")
            continue
        if os.path.exists(run_dir) and not os.path.exists(os.path.join(run_dir, "checkpoints")):
            import shutil

            shutil.rmtree(run_dir)  # a run cut off before its first checkpoint starts over
        t0 = time.time()
        log(f"lab: {LABELS[p]} seed {seed} ...")
        if p == "base":
            evaluate_untrained(cfg, log=lambda s: None)
        else:
            resume = os.path.exists(os.path.join(run_dir, "metrics.jsonl"))
            opening: list[int] = []  # the first step of this sitting (a resumed run's is not 1)

            def step_done(step: int, p=p, seed=seed, n=cfg.train.steps, t0=t0, opening=opening) -> None:
                opening[:] = opening or [step]
                log(f"lab: {LABELS[p]} seed {seed}: step {step}/{n} ({time.time() - t0:.0f}s, "
                    f"{eta(time.time() - t0, step - opening[0] + 1, n - step)})")

            train(cfg, resume=resume, log=lambda s: None, on_step_end=step_done)
        r = run_summary(run_dir)
        log(f"lab: {LABELS[p]} seed {seed}: held-out unseen {_f(r.get('unseen'))}, "
            f"seen {_f(r.get('seen'))}, train reward {_f(r.get('train_reward'))} "
            f"({time.time() - t0:.0f}s; {time.time() - t_all:.0f}s so far)")
        if records:  # this run's record, as soon as it is finished
            for path in pack(out, records, only=(p, seed)):
                log(f"lab: packed {path}")
    if records:  # runs finished before this invocation, too
        for path in pack(out, records):
            log(f"lab: packed {path}")
    results = aggregate(out, [p for p in PARADIGMS if p in paradigms], seeds,
                        grid_same_weights(configs, overrides, paradigms))
    with open(os.path.join(out, "dialogues.md"), "w") as f:
        from .cards import dialogue_cards

        f.write(dialogue_cards(out, [p for p in PARADIGMS if p in paradigms], LABELS))
    results["simulators"] = cards
    results["quick"], results["seeds"] = quick, seeds
    import torch

    results["threads"] = torch.get_num_threads()
    results["seconds"] = time.time() - t_all
    write_outputs(out, results)
    log(f"lab: wrote {out}/table.md, {out}/curves.png and {out}/results.json in {time.time() - t_all:.0f}s")
    return results


def read_plan(configs: str, have: tuple[str, ...]) -> list[tuple[str, int]]:
    """The grid's runs in order from ``configs/grid.yaml`` (see :data:`PLAN`), or [] without one."""
    import yaml

    path = os.path.join(configs, PLAN)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{path}: expected `runs: [paradigm or paradigm@seed, ...]`")
    out = []
    for item in runs:
        name, _, seed = str(item).partition("@")
        if name not in have:
            raise ValueError(f"{path}: {item!r}: no such paradigm here (configs for {', '.join(have)})")
        if seed and not seed.isdigit():
            raise ValueError(f"{path}: {item!r}: the seed after @ must be a number")
        out.append((name, int(seed or 0)))
    return out


def grid_same_weights(configs: str, overrides: list[str], paradigms) -> set[str]:
    """The panel's unseen simulators that run on the weights of a training simulator of any paradigm of
    the grid (``scope.panels``), marked in its tables."""
    from ..config import load_config
    from ..eval import load_panel
    from ..panels import same_weights, training_simulators

    cfgs = [load_config(os.path.join(configs, p + ".yaml"), overrides) for p in paradigms if p != "base"]
    if not cfgs or not cfgs[0].eval.panel:
        return set()
    panel = load_panel(cfgs[0].eval.panel)
    return same_weights(panel, {**cfgs[0].models, **panel.models}, [s for c in cfgs for s in training_simulators(c)])


def simulator_cards(out: str, cfg, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """What each simulator of the panel does (``scope.lab.check``), measured once per grid (building the
    lab's models on first use) and written to ``simulators.md`` / ``simulators.json``."""
    from .check import cards_markdown, panel_cards

    path = os.path.join(out, "simulators.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    t0 = time.time()
    log("lab: the simulators' behaviour cards (builds the lab's models on first use) ...")
    cards = panel_cards(cfg, log=log)
    with open(path, "w") as f:
        json.dump(cards, f, indent=1)
    with open(os.path.join(out, "simulators.md"), "w") as f:
        f.write("How often each simulator of the panel says yes to each move of a scripted agent, and names its "
                "need when asked (64 dialogues per move).\n\n" + cards_markdown(cards))
    log(f"lab: wrote {out}/simulators.md ({time.time() - t0:.0f}s)")
    return cards


# ---- aggregation -------------------------------------------------------------------------------
def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _mean_std(xs: list[float | None]) -> tuple[float, float]:
    vals = [x for x in xs if x is not None and not math.isnan(x)]
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    return m, (math.sqrt(sum((x - m) ** 2 for x in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0)


def eval_cells(run_dir: str) -> tuple[dict[int, Cells], dict[str, bool | str], dict[int, dict[str, int]]]:
    """Each evaluation of a run as :data:`scope.stats.Cells` (simulator -> task -> mean reward), by step,
    each simulator's seen flag and, by step, each simulator's number of dialogues, from
    ``eval/step_N/eval_episodes.jsonl`` and ``eval.json``."""
    from ..stats import cells_of

    d = os.path.join(run_dir, "eval")
    cells: dict[int, Cells] = {}
    seen: dict[str, bool | str] = {}  # seen (True), unseen (False) or "control"
    counts: dict[int, dict[str, int]] = {}
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
    return cells, seen, counts


def run_summary(run_dir: str) -> dict[str, Any]:
    """Final scores, curves, every evaluation's per-task rewards and the collapse signatures of one run."""
    from ..run import read_metrics

    ms = read_metrics(run_dir)
    ev = [m for m in ms if "eval/panel_mean" in m]
    tr = [m for m in ms if "reward_mean" in m]
    last = ev[-1] if ev else {}
    curves = {k: [(m["step"], m[k]) for m in ms if isinstance(m.get(k), (int, float))] for k, _ in CURVES}
    for k in ("collapse/partner_share", "collapse/partner_var", "collapse/agent_var"):
        curves[k] = [(m["step"], m[k]) for m in ms if isinstance(m.get(k), (int, float))]
    cells, seen_flags, counts = eval_cells(run_dir)
    out = {"seen": last.get("eval/seen_mean"), "unseen": last.get("eval/unseen_mean"),
           "all": last.get("eval/panel_mean"), "unseen_se": last.get("eval/unseen_se"),
           "seen_se": last.get("eval/seen_se"), "panel_se": last.get("eval/panel_se"), "curves": curves,
           "per_partner": {k[len("eval/partner/"):]: v for k, v in last.items() if k.startswith("eval/partner/")},
           "cells": {str(k): v for k, v in cells.items()}, "seen_flags": seen_flags,
           "dialogues": counts.get(int(last["step"]), {}) if last else {},
           "last_eval_step": last.get("step")}
    if tr:
        out["train_reward"] = window([m["reward_mean"] for m in tr])
        out["train_reward_start"] = window([m["reward_mean"] for m in tr], end=False)
        ent = [m["policy_entropy"] for m in tr if "policy_entropy" in m]
        out["entropy_start"], out["entropy_end"] = window(ent, end=False), window(ent)
        out["zero_variance_end"] = window([m["zero_variance_frac"] for m in tr if "zero_variance_frac" in m])
        share = [v for _, v in curves["collapse/partner_share"]]
        # measured every few steps only (diagnostics.decompose_every): its first and its last measurement, as a
        # window of 4 measurements would span most of a short run at both ends
        out["partner_share_start"], out["partner_share_end"] = (share[0], share[-1]) if share else (None, None)
    un = curves["eval/unseen_mean"]
    trained = [(s, v) for s, v in un if s > 0]  # the step-0 evaluation is Base, not a point of this run's curve
    if trained:
        out["unseen_peak"] = max(v for _, v in trained)
        out["unseen_peak_step"] = max(trained, key=lambda sv: (sv[1], -sv[0]))[0]
        out["unseen_drop_from_peak"] = out["unseen_peak"] - trained[-1][1]
        start = [v for s, v in un if s == 0]
        if start:
            out["unseen_start"] = start[0]
            out["unseen_peak_over_start"] = out["unseen_peak"] - start[0]
    seen = [m for m in ev if m["step"] > 0 and isinstance(m.get("eval/seen_mean"), (int, float))]
    if seen:  # the checkpoint training keeps (chosen on the seen simulators) and its unseen score
        best = max(seen, key=lambda m: (m["eval/seen_mean"], -m["step"]))
        out["best_seen_step"], out["unseen_at_best_seen"] = best["step"], best.get("eval/unseen_mean")
    return out


def _group_name(flag: Any) -> str:
    return "control" if flag == "control" else "seen" if flag else "unseen"


def _group(r: dict[str, Any], which: str) -> list[str]:
    """The simulators of a run's panel in a group: ``seen``, ``unseen``, ``all`` (both) or ``control``."""
    flags = r.get("seen_flags", {})
    if which == "control":
        return [k for k, v in flags.items() if v == "control"]
    return [k for k, v in flags.items() if v != "control" and (which == "all" or v == (which == "seen"))]


def _cells_at(r: dict[str, Any], step: Any) -> Cells | None:
    return r.get("cells", {}).get(str(step)) if step is not None else None


def peak_test(r: dict[str, Any]) -> dict[str, Any]:
    """Single's unseen peak (its best trained evaluation) against Base (its own step-0 evaluation), paired
    over the tasks: the difference, its bootstrap s.e. and interval, and whether it exceeds two s.e.
    ("peaks" is written only then). The peak is the maximum of several noisy evaluations, so two s.e. is
    a lenient bar; the test is one-sided at the chosen step. Also the final evaluation against Base."""
    from ..stats import exceeds, task_bootstrap

    unseen = _group(r, "unseen")
    base, peak, end = _cells_at(r, 0), _cells_at(r, r.get("unseen_peak_step")), _cells_at(r, r.get("last_eval_step"))
    if base is None or peak is None or end is None or not unseen:
        return {}
    d = task_bootstrap([peak], unseen, minus=[base])
    e = task_bootstrap([end], unseen, minus=[base])
    return {"peak_step": r["unseen_peak_step"], "peak_minus_base": d, "peaks": exceeds(d),
            "end_minus_base": e, "ends_below_base": bool(e["hi"] < 0)}


def aggregate(out: str, paradigms: list[str], seeds: int, same_weights: set[str] | None = None) -> dict[str, Any]:
    """Per paradigm: the means over seeds, their evaluation intervals (a bootstrap over the tasks, every
    simulator and seed resampled with the same tasks: ``scope.stats.task_bootstrap``) and the seeds' own
    values (their spread, reported beside the interval, not in it); per simulator, the mean over seeds with
    a Wilson interval over all its episodes; and the signatures."""
    from ..stats import task_bootstrap, wilson

    runs = {p: [run_summary(os.path.join(out, p, f"seed{s}")) for s in range(seeds)
                if os.path.exists(os.path.join(out, p, f"seed{s}", "metrics.jsonl"))] for p in paradigms}
    summary = {}
    for p, rs in runs.items():
        row: dict[str, Any] = {"seeds": len(rs)}
        for k in ("seen", "unseen", "all", "train_reward", "train_reward_start", "entropy_start", "entropy_end",
                  "zero_variance_end", "unseen_peak", "unseen_drop_from_peak", "unseen_peak_over_start",
                  "unseen_at_best_seen", "partner_share_start", "partner_share_end"):
            vals = [r.get(k) for r in rs]
            row[k], row[k + "_std"] = _mean_std(vals)
            row[k + "_seeds"] = vals
        for k, step_of in (("seen", "last_eval_step"), ("unseen", "last_eval_step"), ("all", "last_eval_step"),
                           ("unseen_at_best_seen", "best_seen_step")):
            group = "unseen" if k == "unseen_at_best_seen" else k
            cells = [c for r in rs if (c := _cells_at(r, r.get(step_of))) is not None]
            if cells and rs and _group(rs[0], group):
                b = task_bootstrap(cells, _group(rs[0], group))
                row[k + "_lo"], row[k + "_hi"] = b["lo"], b["hi"]
                one: list[float | None] = [task_bootstrap([c], _group(rs[0], group), resamples=500)["se"]
                                           for c in cells]
                row[f"noise_{group}_se" if k != "unseen_at_best_seen" else "noise_best_se"] = _mean_std(one)[0]
        row["per_simulator"] = {}
        sims = {k for r in rs for k in (r.get("per_partner") or {})}
        for sim in sorted(sims, key=lambda k: list(rs[0].get("per_partner", {})).index(k)
                          if k in rs[0].get("per_partner", {}) else 99):
            means = [r["per_partner"][sim] for r in rs if sim in (r.get("per_partner") or {})]
            ns = [r.get("dialogues", {}).get(sim, 0) for r in rs if sim in (r.get("per_partner") or {})]
            m = sum(means) / len(means)
            # pooled over seeds: every dialogue of every seed a trial, at the seeds' dialogue-weighted mean
            pooled = sum(x * n for x, n in zip(means, ns)) / sum(ns) if sum(ns) else m
            lo, hi = wilson(pooled, sum(ns))
            row["per_simulator"][sim] = {"mean": m, "lo": lo, "hi": hi, "dialogues": sum(ns),
                                         "seen": rs[0].get("seen_flags", {}).get(sim),
                                         "same_weights": sim in (same_weights or set())}
        summary[p] = row
    return {"paradigms": summary, "runs": runs, "signatures": signatures(summary, runs),
            "same_weights": sorted(same_weights or [])}


def signatures(summary: dict[str, dict], runs: dict[str, list]) -> dict[str, Any]:
    """RL (Single)'s collapse signatures per seed (training reward over the last TRAIN_WINDOW steps, its
    unseen peak tested against Base, its drop from the peak, where it ends against Base), each cure's
    margin over Single on the unseen simulators with its paired interval, and which orderings among the
    cures the numbers support (the thresholds the lab's tests assert). Entropy and zero-variance are
    reported in the table, not here: they fall and climb under every paradigm of the lab."""
    from ..stats import spread, task_bootstrap

    out: dict[str, Any] = {}
    single = runs.get("single") or []
    if not single:
        return out
    out["single"] = []
    for r in single:
        t = peak_test(r)
        out["single"].append({"train_reward": r.get("train_reward"),
                              "unseen_drop_from_peak": r.get("unseen_drop_from_peak"),
                              "unseen_peak_over_start": r.get("unseen_peak_over_start"),
                              "peak_step": t.get("peak_step"),
                              "peak_minus_base_se": t.get("peak_minus_base", {}).get("se"),
                              "peaks": t.get("peaks"), "end_minus_base": t.get("end_minus_base", {}).get("mean"),
                              "end_minus_base_lo": t.get("end_minus_base", {}).get("lo"),
                              "end_minus_base_hi": t.get("end_minus_base", {}).get("hi"),
                              "ends_below_base": t.get("ends_below_base")})
    s_unseen = summary["single"]["unseen"]
    cures = [p for p in summary if p not in ("single", "base")]
    out["cure_margin_unseen"] = {p: summary[p]["unseen"] - s_unseen for p in cures}
    out["cure_ranking_unseen"] = sorted(cures, key=lambda p: -out["cure_margin_unseen"][p])

    def final(p):
        rs = runs.get(p) or []
        return [c for r in rs if (c := _cells_at(r, r.get("last_eval_step"))) is not None], \
            (_group(rs[0], "unseen") if rs else [])

    s_cells, unseen = final("single")
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


def _iv(r: dict, k: str, nd: int = 3) -> str:
    """A mean with its evaluation interval: ``0.494 [0.451, 0.537]``."""
    if r.get(k) is None or (isinstance(r[k], float) and math.isnan(r[k])):
        return "n/a"
    lo, hi = r.get(k + "_lo"), r.get(k + "_hi")
    return _f(r[k], nd) + (f" [{_f(lo, nd)}, {_f(hi, nd)}]" if lo is not None and not math.isnan(lo) else "")


def _seeds(r: dict, k: str, nd: int = 3) -> str:
    vals = [v for v in r.get(k + "_seeds", []) if v is not None and not math.isnan(v)]
    return ", ".join(_f(v, nd) for v in vals) if vals else "n/a"


def table(results: dict[str, Any]) -> str:
    from ..panels import SAME_WEIGHTS_MARK

    rows = results["paradigms"]
    lines = ["| paradigm | held-out seen | held-out unseen | unseen, per seed | held-out all | unseen at the "
             "best-on-seen checkpoint | training reward, per seed | entropy start -> end | zero-variance (end) | "
             "simulator-side share start -> end | seeds |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p, r in rows.items():
        ent = "n/a" if math.isnan(r["entropy_start"]) else f"{_f(r['entropy_start'], 2)} -> {_f(r['entropy_end'], 2)}"
        share = ("n/a" if math.isnan(r.get("partner_share_start", math.nan))
                 else f"{_f(r['partner_share_start'], 2)} -> {_f(r['partner_share_end'], 2)}")
        lines.append(f"| {LABELS[p]} | {_iv(r, 'seen')} | {_iv(r, 'unseen')} | {_seeds(r, 'unseen')} | "
                     f"{_iv(r, 'all')} | "
                     f"{_iv(r, 'unseen_at_best_seen')} | {_seeds(r, 'train_reward')} | {ent} | "
                     f"{_f(r['zero_variance_end'], 2)} | {share} | {r['seeds']} |")
    noise = [r["noise_unseen_se"] for r in rows.values() if not math.isnan(r.get("noise_unseen_se", math.nan))]
    lines += ["", "Final held-out reward (the mean over seeds of the panel's mean per simulator group), with its 95% "
                  "interval: a bootstrap over the evaluation's tasks, the same resample for every simulator and seed "
                  "(evaluation noise given the trained policies). The seeds' own values are listed beside it: their "
                  "spread is training noise, which the interval does not hold. "
                  f"Training reward, entropy and zero-variance: the mean of the first / last {TRAIN_WINDOW} steps. "
                  "Simulator-side share: the partner part of the reward variance (E[Var(R | agent turns)] / total, "
                  "the variance decomposition) at its first and its last measurement. "
                  "The bootstrap s.e. of one run's unseen mean is about "
                  f"{_f(sum(noise) / len(noise) if noise else math.nan)}."
                  + (f" torch threads: {results['threads']} (the numbers depend on it)."
                     if results.get("threads") else "")]
    first_sims: dict[str, dict[str, Any]] = next(
        (r["per_simulator"] for r in rows.values() if r.get("per_simulator")), {})
    sims, seen_of = list(first_sims), {k: v.get("seen") for k, v in first_sims.items()}
    if sims:
        same = set(results.get("same_weights", []))
        lines += ["", "Final held-out reward per simulator (mean over seeds; 95% Wilson interval over all its "
                      "dialogues of every seed" + (f"; {SAME_WEIGHTS_MARK}: an unseen simulator on a training "
                                                  "simulator's weights" if same else "") + "):", "",
                  "| paradigm | " + " | ".join(f"{k}{SAME_WEIGHTS_MARK if k in same else ''} "
                                               f"({_group_name(seen_of.get(k))})"
                                               for k in sims) + " |",
                  "|---|" + "---|" * len(sims)]
        for p, r in rows.items():
            ps = r.get("per_simulator", {})
            lines.append(f"| {LABELS[p]} | " + " | ".join(
                f"{_f(ps[k]['mean'], 2)} [{_f(ps[k]['lo'], 2)}, {_f(ps[k]['hi'], 2)}]" if k in ps else "n/a"
                for k in sims) + " |")
    sig = results.get("signatures", {})
    if sig.get("single"):
        lines += ["", "RL (Single), per seed: " + "; ".join(
            f"training reward {_f(x['train_reward'], 2)}; unseen peak (step {x['peak_step']}) minus Base "
            f"{_f(x['unseen_peak_over_start'], 3)} (2 s.e. = {_f(2 * (x['peak_minus_base_se'] or math.nan), 3)}: "
            f"{'a peak' if x['peaks'] else 'not a peak, within the noise'}), then a drop of "
            f"{_f(x['unseen_drop_from_peak'], 3)}; the end minus Base {_f(x['end_minus_base'], 3)} "
            f"[{_f(x['end_minus_base_lo'], 3)}, {_f(x['end_minus_base_hi'], 3)}]"
            f"{' (below Base)' if x['ends_below_base'] else ''}" for x in sig["single"]) + "."]
        iv = sig.get("cure_margin_interval", {})
        lines += ["", "Margin over RL (Single) on the unseen simulators (95% paired interval over the tasks): "
                  + ", ".join(
            f"{LABELS[p]} {sig['cure_margin_unseen'][p]:+.3f}"
            + (f" [{iv[p][0]:+.3f}, {iv[p][1]:+.3f}]" if p in iv else "") for p in sig["cure_ranking_unseen"]) + "."]
        sup = sig.get("cure_orderings_supported", [])
        lines += ["", ("Orderings among the cures that the numbers support (paired interval above 0 and every "
                       "seed above every seed): " + ", ".join(f"{LABELS[a]} > {LABELS[b]}" for a, b in sup) + ".")
                  if sup else
                  "No ordering among the cures is supported (none has a paired interval above 0 together with every "
                  "seed above every seed of the other): the margins above are not a ranking."]
    return "\n".join(lines) + "\n"


def write_outputs(out: str, results: dict[str, Any]) -> None:
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=float)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table(results))
    try:
        plot_curves(out, results)
    except ImportError:  # the core install: the tables and results.json, no figures
        print("lab: no curves.png (the figures need scope[plots]: pip install 'scope[plots]')", file=sys.stderr)


def plot_curves(out: str, results: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    written = []
    # a curve no run measured (the simulator's behaviour where its replies are a readout) gets no empty panel
    shown = [(k, t) for k, t in CURVES if any(r["curves"].get(k) for rs in runs.values() for r in rs)] or CURVES[:1]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.6), dpi=100, squeeze=False)
    for ax, (key, title) in zip(axes[0], shown):
        _draw(ax, runs, key, title)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out, "curves.png")
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    for key, title in shown:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        _draw(ax, runs, key, title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out, key.replace("/", "_") + ".png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _draw(ax, runs: dict[str, list], key: str, title: str) -> None:
    for p, rs in runs.items():
        series: dict[int, list[float]] = {}
        for r in rs:
            for step, v in r["curves"].get(key, []):
                series.setdefault(step, []).append(v)
        if not series:
            continue
        xs = sorted(series)
        ys = [sum(series[x]) / len(series[x]) for x in xs]
        if len(xs) == 1:  # Base: a level, not a curve
            ax.axhline(ys[0], ls=":", color="gray", label=LABELS[p])
            continue
        ax.plot(xs, ys, marker="o" if len(xs) < 12 else None, ms=3, label=LABELS[p])
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
