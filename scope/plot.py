"""``scope plot RUN_DIR [RUN_DIR ...]``: PNG figures of several runs overlaid (a dotted line where a collapse
alarm fired, and a dashed one where the partner was switched), and a markdown table of best and final held-out
scores per run with the alarms that fired."""
from __future__ import annotations

import math
import os
from typing import Any

from .run import read_metrics

FIGURES = [
    ("train_reward.png", "training reward", "reward_mean", "reward_std"),
    ("heldout_reward.png", "held-out panel reward (band: std across partners)", "eval/panel_mean", "eval/panel_std"),
    ("policy_entropy.png", "policy token entropy", "policy_entropy", None),
    ("zero_variance.png", "zero-variance group fraction", "zero_variance_frac", None),
    ("turns.png", "conversation turns", "turns_mean", None),
]
COOP_FIGURES = [  # drawn when the runs are cooperative coding (their metrics carry coop/*)
    ("coop_success.png", "cooperative coding: pair success rate", "coop/success_rate", None),
    ("coop_merge_conflicts.png", "cooperative coding: share of pairs whose plain merge conflicted",
     "coop/conflict_rate", None),
    ("coop_messages.png", "cooperative coding: messages per episode", "coop/messages_per_episode", None),
    ("coop_turns_to_submit.png", "cooperative coding: turns to submit", "coop/turns_to_submit", None),
]


def _series(ms: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for m in ms:
        v = m.get(key)
        if isinstance(v, (int, float)) and not math.isnan(v):
            xs.append(int(m["step"]))
            ys.append(float(v))
    return xs, ys


def label_of(run_dir: str) -> str:
    return os.path.basename(os.path.normpath(run_dir))


def plot_runs(run_dirs: list[str], out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {label_of(d): read_metrics(d) for d in run_dirs}
    os.makedirs(out_dir, exist_ok=True)
    written = []
    coop = any("coop/success_rate" in m for ms in runs.values() for m in ms)
    for fname, title, key, band in FIGURES + (COOP_FIGURES if coop else []):
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        drawn = False
        for label, ms in runs.items():
            xs, ys = _series(ms, key)
            if not xs:
                continue
            line, = ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=label)
            for m in ms:  # the alarms that fired (scope.alarms), and a partner switch, on every curve
                if m.get("alarm_events"):
                    ax.axvline(m["step"], ls=":", lw=1, color=line.get_color())
                if m.get("partner_switched"):
                    ax.axvline(m["step"], ls="--", lw=1, color=line.get_color())
            if band:
                bx, bs = _series(ms, band)
                sd = dict(zip(bx, bs))
                lo = [y - sd.get(x, 0.0) for x, y in zip(xs, ys)]
                hi = [y + sd.get(x, 0.0) for x, y in zip(xs, ys)]
                ax.fill_between(xs, lo, hi, alpha=0.2, color=line.get_color())
            drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, f"no '{key}' in these runs", ha="center", va="center", transform=ax.transAxes)
        path = os.path.join(out_dir, fname)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    table = scores_table(runs)
    path = os.path.join(out_dir, "scores.md")
    with open(path, "w") as f:
        f.write(table)
    written.append(path)
    return written


def scores_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Each run's best checkpoint chosen on the seen partners (as training chooses RUN_DIR/best), with the
    unseen score at that step beside it, and the final scores, each held-out score with its 95% interval
    (mean +- 1.96 of the evaluation's task-bootstrap s.e., where the run logged one)."""
    from .stats import TRAIN_WINDOW, window

    def f(x: Any) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    def iv(m: dict[str, Any] | None, key: str) -> str:
        if m is None:
            return "n/a"
        se = m.get(f"eval/{key}_se")
        return f(m.get(f"eval/{key}_mean")) + (f" ± {1.96 * se:.3f}" if isinstance(se, (int, float))
                                               and se == se else "")

    lines = ["| run | best on seen (step) | unseen at that step | final seen | final unseen | "
             f"train reward (mean of the last {TRAIN_WINDOW} steps) |",
             "|---|---|---|---|---|---|"]
    for label, ms in runs.items():
        ev = [m for m in ms if isinstance(m.get("eval/seen_mean"), (int, float))]
        best = max(ev, key=lambda m: (m["eval/seen_mean"], -m["step"])) if ev else None
        last = ev[-1] if ev else {}
        _, tr = _series(ms, "reward_mean")
        chosen = f"{iv(best, 'seen')} ({best['step']})" if best else "n/a"
        lines.append(f"| {label} | {chosen} | {iv(best, 'unseen')} | {iv(last, 'seen')} | {iv(last, 'unseen')} | "
                     f"{f(window(tr))} |")
    events = [(label, e) for label, ms in runs.items() for m in ms for e in m.get("alarm_events", [])]
    if events:
        lines += ["", "Alarms that fired (dotted on the curves):", ""]
        lines += [f"- {label}: {e['name']} ({e['detector']}) at step {e['step']}, action {e['action']}: {e['message']}"
                  for label, e in events]
    return "\n".join(lines) + "\n"


def run_plots(run_dir: str) -> list[str]:
    """The run's curves as PNG files in RUN_DIR/plots (for the trackers that keep images), or none where
    matplotlib is not installed."""
    try:
        return [p for p in plot_runs([run_dir], os.path.join(run_dir, "plots")) if p.endswith(".png")]
    except ImportError:
        return []
