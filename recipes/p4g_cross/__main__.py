"""P4G-pitch across families: its own commands (the grid: ``scope grid --configs recipes/p4g_cross/configs``).

    python -m recipes.p4g_cross sims        # G1-G4: Gemma 3 270M fitted to P1-P4's quarters (and P1-P4 restored)
    python -m recipes.p4g_cross pilot       # every member scores the pilot's pitches; G1's go/no-go; family correlation
    python -m recipes.p4g_cross cards       # fidelity cards of P1-P4 and G1-G4
    python -m recipes.p4g_cross rescore     # P4G-pitch's recorded evaluation pitches under G1-G4
    python -m recipes.p4g_cross verdicts    # the pre-registered signatures, from a grid
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.relpath(os.path.join(HERE, "configs"))


def log(s: str) -> None:
    print(s, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipes.p4g_cross", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sims = sub.add_parser("sims", help="G1-G4 fitted (P1-P4 restored from P4G-pitch's records)")
    sims.add_argument("--data-dir", default="../shared/data/p4g")
    sims.add_argument("--only", help="comma-separated: these of g1,g2,g3,g4 only")
    for name, text in (("pilot", "every member scores the pilot's pitches; the go/no-go"),
                       ("cards", "each simulator's fidelity card"),
                       ("rescore", "P4G-pitch's recorded evaluation pitches under G1-G4"),
                       ("verdicts", "the pre-registered signatures from a grid")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--configs", default=CONFIGS)
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--out", help="output directory (default runs/p4g-cross/<command>)")
    sub.choices["pilot"].add_argument("--pitches", type=int, default=256)
    sub.choices["pilot"].add_argument("--personas", type=int, default=4)
    sub.choices["cards"].add_argument("--dialogues", type=int, default=48)
    sub.choices["rescore"].add_argument("--records", default="recipes/p4g_pitch/records")
    sub.choices["rescore"].add_argument("--final-only", action="store_true", help="Base and each run's last step")
    sub.choices["verdicts"].add_argument("--grid", default="runs/p4g-cross/grid")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from . import analysis

    out = getattr(a, "out", None) or os.path.join("runs", "p4g-cross", a.cmd)
    if a.cmd == "sims":
        analysis.fit_sims(a.data_dir, only=a.only.split(",") if a.only else None, log=log)
    elif a.cmd == "pilot":
        analysis.pilot(a.configs, out, n_sampled=a.pitches, n_personas=a.personas, overrides=a.set, log=log)
    elif a.cmd == "cards":
        analysis.cards(a.configs, out, n_dialogues=a.dialogues, overrides=a.set, log=log)
    elif a.cmd == "rescore":
        analysis.rescore(a.configs, a.records, out, overrides=a.set, log=log, final_only=a.final_only)
    else:
        from .verdicts import verdicts, verdicts_markdown

        print(verdicts_markdown(verdicts(a.grid, a.configs, log=log)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
