"""``scope lab``: the collapse lab's grid of paradigms x seeds, through ``scope train``'s own loop.

Each paradigm is a config in ``configs/lab/`` (they extend ``common.yaml``); each run is an ordinary
training run in ``OUT/<paradigm>/seed<k>/`` with its held-out panel evaluated every ``eval.every``
steps and at step 0. Base is the untrained agent, evaluated on the same panel. A finished run is not
run again, so an interrupted grid continues where it stopped. At the end the grid writes:

- ``results.json``: per run, the final panel scores and the curves; per paradigm, means and stds;
- ``table.md``: a Table-1-style table (held-out reward on seen / unseen / all simulators, mean +- std
  over seeds, with the evaluation noise), the training reward and the collapse signatures;
- ``curves.png`` (and one PNG per panel): Figure-3-style curves per paradigm, averaged over seeds:
  training reward, held-out reward on the unseen simulators, policy entropy, zero-variance group
  fraction and the simulator's behaviour modal mass.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from collections import Counter
from typing import Any, Callable

PARADIGMS = ("base", "single", "ensemble", "persona", "persona_evolved", "vs", "cotrain", "population")
"""Every paradigm the grid knows; a grid runs those of them that have a config in its directory
(``persona_evolved``: the persona paradigm with evolved personas, in ``configs/p4g_mini`` only)."""
LABELS = {"base": "Base", "single": "RL (Single)", "ensemble": "Ensemble", "persona": "Persona",
          "persona_evolved": "Persona (evolved)",
          "vs": "Verbalized Sampling", "cotrain": "Co-Training", "population": "Population Co-Training"}
QUICK: dict[str, Any] = {"seeds": 1, "overrides": ["train.steps=20", "eval.every=5"]}
"""``--quick``: one seed and half the steps (the CI run and the demo)."""
CURVES = [("reward_mean", "training reward"), ("eval/unseen_mean", "held-out reward (unseen simulators)"),
          ("policy_entropy", "policy entropy (nats/token)"), ("zero_variance_frac", "zero-variance group fraction"),
          ("partner_behaviour/modal_mass", "simulator behaviour modal mass")]


def _finished(run_dir: str, steps: int) -> bool:
    from ..run import read_metrics

    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return False
    try:
        return any(m.get("step") == steps for m in read_metrics(path))
    except (ValueError, OSError):
        return False


def evaluate_untrained(cfg, log: Callable[[str], None]) -> None:
    """Base: the agent as built, on the panel, written as the step-0 line of a run directory."""
    from ..run import MetricsLogger, RunDir
    from ..setup import build_judge, build_models
    from ..train import PanelEval, seed_all

    run = RunDir(cfg.run.dir, cfg)
    seed_all(cfg.run.seed)
    backends, _, trainable = build_models(cfg)
    evaluator = PanelEval(cfg, backends, trainable["agent"], run, build_judge(cfg, backends))
    m = evaluator.run(0, log)
    logger = MetricsLogger(run)
    logger.write(0, m)
    logger.close()


def available(configs: str) -> tuple[str, ...]:
    """The paradigms of PARADIGMS that have a config in ``configs`` (Base: the Single config, untrained)."""
    return tuple(p for p in PARADIGMS
                 if os.path.exists(os.path.join(configs, ("single" if p == "base" else p) + ".yaml")))


def run_lab(out: str, configs: str = "configs/lab", paradigms: tuple[str, ...] | None = None, seeds: int = 3,
            overrides: list[str] | None = None, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    from ..config import load_config
    from ..train import train

    overrides = list(overrides or [])
    if quick:
        seeds = min(seeds, QUICK["seeds"])
        overrides = QUICK["overrides"] + overrides
    have = available(configs)
    paradigms = have if paradigms is None else paradigms
    unknown = [p for p in paradigms if p not in have]
    if unknown:
        raise ValueError(f"unknown paradigms {unknown}: {configs} has configs for {', '.join(have)}")
    os.makedirs(out, exist_ok=True)
    t_all = time.time()
    first = load_config(os.path.join(configs, "single.yaml"), overrides)
    cards = simulator_cards(out, first, log) if first.env.name == "lab" else {}  # the lab's simulators, measured
    for seed in range(seeds):
        for p in paradigms:
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
                train(cfg, resume=resume, log=lambda s: None)
            r = run_summary(run_dir)
            log(f"lab: {LABELS[p]} seed {seed}: held-out unseen {_f(r.get('unseen'))}, "
                f"seen {_f(r.get('seen'))}, train reward {_f(r.get('train_reward'))} "
                f"({time.time() - t0:.0f}s; {time.time() - t_all:.0f}s so far)")
    results = aggregate(out, [p for p in PARADIGMS if p in paradigms], seeds)
    with open(os.path.join(out, "dialogues.md"), "w") as f:
        f.write(dialogue_cards(out, [p for p in PARADIGMS if p in paradigms]))
    results["simulators"] = cards
    results["quick"], results["seeds"] = quick, seeds
    results["seconds"] = time.time() - t_all
    write_outputs(out, results)
    log(f"lab: wrote {out}/table.md, {out}/curves.png and {out}/results.json in {time.time() - t_all:.0f}s")
    return results


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


def dialogue_cards(out: str, paradigms: list[str], examples: int = 2) -> str:
    """What each paradigm's agent says at its last evaluation (seed 0), and what the simulators answer: per
    paradigm, its most frequent opening, how often it names a dollar amount, the reward per simulator, and a
    few whole dialogues (with the first seen and the first unseen simulator)."""

    lines = ["# What the agents say at the end of training (seed 0, the last evaluation)", ""]
    for p in paradigms:
        d = os.path.join(out, p, "seed0", "eval")
        steps = sorted(os.listdir(d)) if os.path.isdir(d) else []
        if not steps:
            continue
        with open(os.path.join(d, steps[-1], "eval_episodes.jsonl")) as f:
            eps = [json.loads(x) for x in f if x.strip()]
        opens = Counter(next((m["content"] for m in e["messages"] if m["role"] == "agent"), "") for e in eps)
        agent_turns = [m["content"] for e in eps for m in e["messages"] if m["role"] == "agent"]
        dollars = sum(bool(re.search(r"\$\s*\d", t)) for t in agent_turns) / max(len(agent_turns), 1)
        lines += [f"## {LABELS[p]} ({steps[-1].replace('_', ' ')})", "",
                  f"- most frequent opening ({opens.most_common(1)[0][1]} of {len(eps)} dialogues): "
                  f"\"{opens.most_common(1)[0][0][:200]}\"" if opens else "- no dialogue",
                  f"- agent turns that name a dollar amount: {dollars:.2f}"]
        if any("persona" in e["meta"] for e in eps):  # Persuasion for Good's episodes
            lines += p4g_lines(eps, agent_turns)
        by: dict[str, list[dict]] = {}
        for e in eps:
            by.setdefault(e["meta"].get("partner", "?"), []).append(e)
        lines.append("- reward per simulator: " + ", ".join(
            f"{k} {sum(x['rewards'].get('agent', 0.0) for x in v) / len(v):.3f}" for k, v in by.items()))
        lines.append("")
        shown = list(by)[:1] + [k for k in by if k not in list(by)[:3]][:1]
        for k in shown:
            for e in by[k][:examples]:
                lines.append(f"**with {k}** (reward {e['rewards'].get('agent', 0.0):.2f}):")
                lines += [f"> {m['role']}: {m['content'][:300]}" for m in e["messages"]]
                lines.append("")
    return "\n".join(lines) + "\n"


def p4g_lines(eps: list[dict], agent_turns: list[str]) -> list[str]:
    """Persuasion for Good: what the persuadees decided (no amount stated counts as no gift) and how often the
    persuader still talks about the cause."""
    gifts = Counter("none stated" if e["meta"].get("donation") is None else f"${e['meta']['donation']:g}" for e in eps)
    cause = sum(bool(re.search(r"charit|children|donat|save the", t, re.IGNORECASE)) for t in agent_turns)
    return ["- persuadees' decisions: " + ", ".join(f"{k} {v}" for k, v in gifts.most_common(6)) + f" (of {len(eps)})",
            f"- agent turns that mention the charity, children or donating: {cause / max(len(agent_turns), 1):.2f}"]


# ---- aggregation -------------------------------------------------------------------------------
def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _mean_std(xs: list[float | None]) -> tuple[float, float]:
    vals = [x for x in xs if x is not None and not math.isnan(x)]
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    return m, (math.sqrt(sum((x - m) ** 2 for x in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0)


def run_summary(run_dir: str) -> dict[str, Any]:
    """Final scores, curves and collapse signatures of one run."""
    from ..run import read_metrics

    ms = read_metrics(run_dir)
    ev = [m for m in ms if "eval/panel_mean" in m]
    tr = [m for m in ms if "reward_mean" in m]
    last = ev[-1] if ev else {}
    curves = {k: [(m["step"], m[k]) for m in ms if isinstance(m.get(k), (int, float))] for k, _ in CURVES}
    out = {"seen": last.get("eval/seen_mean"), "unseen": last.get("eval/unseen_mean"),
           "all": last.get("eval/panel_mean"), "unseen_se": last.get("eval/unseen_se"),
           "seen_se": last.get("eval/seen_se"), "panel_se": last.get("eval/panel_se"), "curves": curves,
           "per_partner": {k[len("eval/partner/"):]: v for k, v in last.items() if k.startswith("eval/partner/")}}
    if tr:
        k = max(1, len(tr) // 10)  # the last tenth of training, smoothed
        out["train_reward"] = sum(m["reward_mean"] for m in tr[-k:]) / k
        ent = [m["policy_entropy"] for m in tr if "policy_entropy" in m]
        out["entropy_start"], out["entropy_end"] = (ent[0], sum(ent[-k:]) / len(ent[-k:])) if ent else (None, None)
        zv = [m["zero_variance_frac"] for m in tr if "zero_variance_frac" in m]
        out["zero_variance_end"] = sum(zv[-k:]) / len(zv[-k:]) if zv else None
    un = curves["eval/unseen_mean"]
    trained = [(s, v) for s, v in un if s > 0]  # the step-0 evaluation is Base, not a point of this run's curve
    if trained:
        out["unseen_peak"] = max(v for _, v in trained)
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


def aggregate(out: str, paradigms: list[str], seeds: int) -> dict[str, Any]:
    runs = {p: [run_summary(os.path.join(out, p, f"seed{s}")) for s in range(seeds)
                if os.path.exists(os.path.join(out, p, f"seed{s}", "metrics.jsonl"))] for p in paradigms}
    summary = {}
    for p, rs in runs.items():
        row: dict[str, float] = {"seeds": len(rs)}
        for k in ("seen", "unseen", "all", "train_reward", "entropy_start", "entropy_end", "zero_variance_end",
                  "unseen_peak", "unseen_drop_from_peak", "unseen_peak_over_start", "unseen_at_best_seen"):
            row[k], row[k + "_std"] = _mean_std([r.get(k) for r in rs])
        row["noise_unseen_se"] = _mean_std([r.get("unseen_se") for r in rs])[0]
        row["noise_seen_se"] = _mean_std([r.get("seen_se") for r in rs])[0]
        summary[p] = row
    return {"paradigms": summary, "runs": runs, "signatures": signatures(summary, runs)}


def signatures(summary: dict[str, dict], runs: dict[str, list]) -> dict[str, Any]:
    """The collapse signatures of RL (Single), per seed, and each cure's margin over Single on the unseen
    simulators (the thresholds the lab's tests assert)."""
    out: dict[str, Any] = {}
    single = runs.get("single") or []
    if single:
        out["single"] = [{
            "train_reward": r.get("train_reward"),
            "unseen_drop_from_peak": r.get("unseen_drop_from_peak"),
            "unseen_peak_over_start": r.get("unseen_peak_over_start"),
            "entropy_ratio": (r["entropy_end"] / r["entropy_start"]) if r.get("entropy_start") else None,
            "zero_variance_end": r.get("zero_variance_end")} for r in single]
        s_unseen = summary["single"]["unseen"]
        out["cure_margin_unseen"] = {p: summary[p]["unseen"] - s_unseen for p in summary
                                     if p not in ("single", "base")}
        out["cure_ranking_unseen"] = sorted(out["cure_margin_unseen"], key=lambda p: -out["cure_margin_unseen"][p])
    return out


def table(results: dict[str, Any]) -> str:
    rows = results["paradigms"]
    lines = ["| paradigm | held-out seen | held-out unseen | held-out all | unseen at the best-on-seen checkpoint | "
             "training reward | entropy start -> end | zero-variance (end) | seeds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p, r in rows.items():
        pm = lambda k, r=r: _f(r[k]) if r["seeds"] < 2 else f"{_f(r[k])} ± {_f(r[k + '_std'])}"  # noqa: E731
        ent = "n/a" if math.isnan(r["entropy_start"]) else f"{_f(r['entropy_start'], 2)} -> {_f(r['entropy_end'], 2)}"
        best = "n/a" if math.isnan(r["unseen_at_best_seen"]) else pm("unseen_at_best_seen")
        lines.append(f"| {LABELS[p]} | {pm('seen')} | {pm('unseen')} | {pm('all')} | {best} | "
                     f"{'n/a' if math.isnan(r['train_reward']) else pm('train_reward')} | {ent} | "
                     f"{_f(r['zero_variance_end'], 2)} | {r['seeds']} |")
    noise = [r["noise_unseen_se"] for r in rows.values() if not math.isnan(r["noise_unseen_se"])]
    lines += ["", "Mean ± std over seeds (one seed: the value) of the final held-out reward "
                  "(the panel's mean per simulator group). "
                  f"Evaluation noise: the standard error of one run's unseen mean is about "
                  f"{_f(sum(noise) / len(noise) if noise else float('nan'))} (seen: "
                  f"{_f(_mean_std([r['noise_seen_se'] for r in rows.values()])[0])})."]
    sig = results.get("signatures", {})
    if sig.get("single"):
        lines += ["", "RL (Single), per seed: " + "; ".join(
            f"train reward {_f(x['train_reward'], 2)}, unseen peak (steps after 0) over Base "
            f"{_f(x['unseen_peak_over_start'], 2)}, unseen drop from that peak {_f(x['unseen_drop_from_peak'], 2)}, "
            f"entropy end/start {_f(x['entropy_ratio'], 2)}, zero-variance {_f(x['zero_variance_end'], 2)}"
            for x in sig["single"]) + "."]
        lines += ["", "Margin over RL (Single) on the unseen simulators: " + ", ".join(
            f"{LABELS[p]} {sig['cure_margin_unseen'][p]:+.3f}" for p in sig["cure_ranking_unseen"]) + "."]
    return "\n".join(lines) + "\n"


def write_outputs(out: str, results: dict[str, Any]) -> None:
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=float)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table(results))
    plot_curves(out, results)


def plot_curves(out: str, results: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    written = []
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.2 * len(CURVES), 3.6), dpi=100)
    for ax, (key, title) in zip(axes, CURVES):
        _draw(ax, runs, key, title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out, "curves.png")
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    for key, title in CURVES:
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
