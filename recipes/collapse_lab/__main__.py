"""The collapse lab's own commands (the grid itself is ``scope grid --configs recipes/collapse_lab/configs``):

    python -m recipes.collapse_lab sweep KEY=V1,V2,... [--arms single,vs] [--seeds 1] [--quick] [--out DIR]
    python -m recipes.collapse_lab cards [--config CFG] [--adapter CKPT] [--episodes 64]
    python -m recipes.collapse_lab alarms [--choose GRID] [--hold NAME=GRID ...] [--out DIR]
    python -m recipes.collapse_lab models [--check]   # ship the models the configs name / rebuild and compare
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["models"]:
        from .prebuilt import check, write

        mp = argparse.ArgumentParser(prog="python -m recipes.collapse_lab models", description="ship the lab's "
                                     "models the configs name in recipes/collapse_lab/prebuilt (sha256 in its "
                                     "manifest.json), or --check: rebuild each from its corpus and compare its bytes")
        mp.add_argument("--check", action="store_true")
        mp.parse_args(argv[1:])
        if "--check" in argv:
            return 0 if all(check(lambda s: print(s, flush=True)).values()) else 1
        write(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs"), lambda s: print(s, flush=True))
        return 0
    if argv[:1] == ["alarms"]:
        from .alarms import main as alarms_main

        return alarms_main(argv[1:])
    if argv[:1] == ["cards"]:
        from .cards import main as cards_main

        return cards_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m recipes.collapse_lab", description="the collapse lab's sweeps "
                                 "and behaviour cards (the grid: scope grid --configs recipes/collapse_lab/configs)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sw = sub.add_parser("sweep", help="run the grid once per value of one knob and tabulate where each cure stops "
                        "working, e.g. models.collapsed.options.vs_fidelity=0,0.5,1 --arms single,vs")
    sw.add_argument("spec", metavar="KEY=V1,V2,...")
    sw.add_argument("--arms", help="comma-separated arms of the lab's grid (default: every arm)")
    sw.add_argument("--seeds", type=int, default=1)
    sw.add_argument("--quick", action="store_true")
    sw.add_argument("--out", help="output directory (default runs/lab-sweep/<knob>)")
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sub.add_parser("cards", help="the behaviour cards of a lab config's panel (see --help after `cards`)")
    sub.add_parser("alarms", help="choose the collapse alarms' thresholds on seed 0, replay them on other runs")
    sub.add_parser("models", help="ship the models the configs name (prebuilt/), or --check: rebuild and compare")
    a = ap.parse_args(argv)
    from .sweep import parse_sweep, run_sweep, sweep_table

    key, values = parse_sweep(a.spec)
    res = run_sweep(a.out or f"runs/lab-sweep/{key.split('.')[-1]}", key, values,
                    tuple(a.arms.split(",")) if a.arms else None, seeds=a.seeds, overrides=a.set,
                    quick=a.quick, log=lambda s: print(s, flush=True))
    print(sweep_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
