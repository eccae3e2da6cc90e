"""A grid's figures: ``curves.png`` (every curve side by side) and one PNG per curve, each arm averaged over
its seeds; an arm evaluated once (the policy as built) is drawn as a level; a collapse alarm that fired in a run
(``scope.alarms``) is a dotted line at its step, in its arm's colour."""
from __future__ import annotations

import os
from typing import Any

from .summary import CURVES


def plot_curves(out: str, results: dict[str, Any], labels: dict[str, str]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    written = []
    # a curve no run measured (the simulator's behaviour where its replies are a readout) gets no empty panel
    shown = [(k, t) for k, t in CURVES if any(r["curves"].get(k) for rs in runs.values() for r in rs)] or CURVES[:1]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.6), dpi=100, squeeze=False)
    for ax, (key, title) in zip(axes[0], shown):
        draw(ax, runs, key, title, labels)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out, "curves.png")
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    for key, title in shown:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        draw(ax, runs, key, title, labels)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out, key.replace("/", "_") + ".png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def draw(ax, runs: dict[str, list], key: str, title: str, labels: dict[str, str]) -> None:
    for a, rs in runs.items():
        series: dict[int, list[float]] = {}
        for r in rs:
            for step, v in r["curves"].get(key, []):
                series.setdefault(step, []).append(v)
        if not series:
            continue
        xs = sorted(series)
        ys = [sum(series[x]) / len(series[x]) for x in xs]
        if len(xs) == 1:  # evaluated once: a level, not a curve
            ax.axhline(ys[0], ls=":", color="gray", label=labels[a])
            continue
        line, = ax.plot(xs, ys, marker="o" if len(xs) < 12 else None, ms=3, label=labels[a])
        for step in sorted({s for r in rs for s, _ in r.get("alarms", [])}):
            ax.axvline(step, ls=":", lw=1, color=line.get_color())
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
