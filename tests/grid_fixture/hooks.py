"""The fixture's hooks: a ``before`` hook that counts the panel's members, and a section that names each arm's
final unseen reward, so that a test can see both reach the grid's results and table."""
from __future__ import annotations

from scope.grid.spec import Section
from scope.stats import fmt


def panel_size(out, cfg, log):
    from scope.eval import load_panel

    return {"members": len(load_panel(cfg.eval.panel).partners)}


def section(results, spec):
    finals = {a: r["unseen"] for a, r in results["arms"].items()}
    return Section("finals", finals, ["Final unseen: " + ", ".join(f"{spec.label(a)} {fmt(v)}"
                                                                   for a, v in finals.items()) + "."])
