"""``python -m recipes.collapse_lab sweep KEY=V1,V2,...``: the lab grid at each value of one knob, and where each
cure stops.

The lab's cures work because of how the lab is built: Verbalized Sampling draws from an honest customer
when ``vs_fidelity`` is 1, the persona notes are followed with probability ``persona_adherence`` (and four
of the five personas are honest), and the collapsed simulator says yes to a blind offer of the basic plan
with probability ``collapse``. A sweep runs the chosen paradigms once per value (each value a grid of its
own under ``OUT/<value>/``, resumable like any grid) and writes:

- ``sweep.md``: per value, each paradigm's final held-out reward on the unseen simulators (and on the
  seen ones), its margin over RL (Single) at the same value when Single is in the sweep, and what the
  collapsed simulator then does (its behaviour card: yes to a blind basic-plan offer);
- ``sweep.png``: unseen reward against the knob, one line per paradigm;
- ``sweep.json``: all of it.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

from scope.grid.runner import run_grid
from scope.grid.spec import read_spec
from scope.stats import fmt

CONFIGS = "recipes/collapse_lab/configs"


def parse_sweep(spec: str) -> tuple[str, list[str]]:
    """``KEY=V1,V2,...`` -> (KEY, [V1, V2, ...])."""
    if "=" not in spec:
        raise ValueError(f"--sweep {spec!r}: expected KEY=V1,V2,... "
                         "(e.g. models.collapsed.options.vs_fidelity=0,0.5,1)")
    key, vals = spec.split("=", 1)
    values = [v.strip() for v in vals.split(",") if v.strip()]
    if not key or len(values) < 2:
        raise ValueError(f"--sweep {spec!r}: a key and at least two values")
    return key.strip(), values


def run_sweep(out: str, key: str, values: list[str], paradigms: tuple[str, ...] | None, seeds: int = 1,
              overrides: list[str] | None = None, quick: bool = False, configs: str = CONFIGS,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    spec = read_spec(configs)
    os.makedirs(out, exist_ok=True)
    paradigms = tuple(spec.arms) if paradigms is None else paradigms
    points = []
    for v in values:
        log(f"lab sweep: {key} = {v}")
        res = run_grid(spec, os.path.join(out, v), arms=paradigms, seeds=seeds,
                       overrides=list(overrides or []) + [f"{key}={v}"], quick=quick, log=log)
        card = res.get("simulators", {}).get("collapsed", {})
        points.append({"value": v,
                       "paradigms": {p: {k: r.get(k) for k in ("unseen", "unseen_std", "seen", "train_reward",
                                                               "noise_unseen_se")}
                                     for p, r in res["arms"].items()},
                       "collapsed_card": {k: card.get(k) for k in ("accept|offer_favourite", "accept|offer_other",
                                                                   "accept|ask_then_match")}})
    result = {"key": key, "values": values, "paradigms": list(paradigms), "seeds": seeds, "quick": quick,
              "points": points, "labels": spec.labels}
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump(result, f, indent=1, default=float)
    with open(os.path.join(out, "sweep.md"), "w") as f:
        f.write(sweep_table(result))
    plot_sweep(out, result)
    log(f"lab sweep: wrote {out}/sweep.md and {out}/sweep.png")
    return result


def sweep_table(result: dict[str, Any]) -> str:
    ps = [p for p in result["paradigms"] if p != "base"]
    head = ["`" + result["key"] + "`", "collapsed: yes to a blind basic-plan offer"]
    head += [f"{result['labels'][p]} unseen (seen)" for p in ps]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for pt in result["points"]:
        row = [pt["value"], fmt(pt["collapsed_card"].get("accept|offer_favourite"), 2)]
        single = pt["paradigms"].get("single", {}).get("unseen")
        for p in ps:
            r = pt["paradigms"].get(p, {})
            cell = f"{fmt(r.get('unseen'))} ({fmt(r.get('seen'))})"
            if single is not None and p != "single" and r.get("unseen") is not None:
                cell += f", {r['unseen'] - single:+.3f} vs Single"
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    se = [r.get("noise_unseen_se") for pt in result["points"] for r in pt["paradigms"].values()
          if isinstance(r.get("noise_unseen_se"), float) and not math.isnan(r["noise_unseen_se"])]
    lines += ["", f"Final held-out reward, {result['seeds']} seed(s) per point"
              + (" (--quick: 20 steps)" if result["quick"] else "") + "; the standard error of one run's unseen mean "
              f"is about {fmt(sum(se) / len(se) if se else float('nan'))}."]
    return "\n".join(lines) + "\n"


def plot_sweep(out: str, result: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        xs = [float(v) for v in result["values"]]
    except ValueError:
        xs = list(range(len(result["values"])))
    for p in result["paradigms"]:
        ys = [pt["paradigms"].get(p, {}).get("unseen") for pt in result["points"]]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None and not (isinstance(y, float) and math.isnan(y))]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=result["labels"][p])
    ax.set_xlabel(result["key"])
    ax.set_ylabel("final held-out reward, unseen simulators")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "sweep.png")
    fig.savefig(path)
    plt.close(fig)
    return path
