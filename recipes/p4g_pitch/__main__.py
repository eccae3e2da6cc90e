"""P4G-pitch's own commands (the grid itself: ``scope grid --configs recipes/p4g_pitch/configs``):

    python -m recipes.p4g_pitch sims       # P1-P4: restored from records/sims, fitted where a record is missing
    python -m recipes.p4g_pitch pilot      # score sampled and written pitches under every simulator; the go/no-go
    python -m recipes.p4g_pitch cards      # each simulator's perplexity of held-out people and W1 to their donations
    python -m recipes.p4g_pitch control    # a few steps with reward = the pitch mentions children, per learning rate
    python -m recipes.p4g_pitch verdicts   # the pre-registered signatures, held or not, from a finished grid
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.relpath(os.path.join(HERE, "configs"))
RECORDS = os.path.relpath(os.path.join(HERE, "records"))
SIMS = "runs/p4g-pitch/sims"


def log(s: str) -> None:
    print(s, flush=True)


def restore_fit(out: str, record: str, name: str, log) -> bool:
    """A committed fit (``record``: its adapter and fit.json) copied to ``out`` where ``out`` has none; True if so."""
    if os.path.isdir(os.path.join(out, "adapter")) or not os.path.isdir(record):
        return False
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(record, out)
    log(f"sims: {name} restored from {record}")
    return True


def sims(data_dir: str, progress: bool = False) -> None:
    """P1-P4, each fitted to one of four disjoint quarters of the train persuadees (``scope sim fit --shard k/4
    --examples recipes.p4g_pitch.fit:fit_views --max-tokens 512``). A fit committed in ``records/sims`` is restored
    and used as it is (its ``fit.json`` names the options it was made with); one with no record is fitted
    (about 10 minutes each here)."""
    from scope.sim.fit import FitConfig, fit

    for k in range(1, 5):
        out, record = os.path.join(SIMS, f"p{k}"), os.path.join(RECORDS, "sims", f"p{k}")
        if restore_fit(out, record, f"P{k}", log):
            continue
        if os.path.isdir(os.path.join(out, "adapter")):
            log(f"sims: P{k} is in {out}")
            continue
        fit(FitConfig(data_dir=data_dir, shard=f"{k}/4", examples="recipes.p4g_pitch.fit:fit_views", max_tokens=512,
                      out=out), log=log, progress=progress)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipes.p4g_pitch", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, text in (("sims", "P1-P4: restored from the records, fitted where missing"),
                       ("pilot", "score sampled and written pitches under every simulator; the go/no-go"),
                       ("cards", "each simulator's perplexity of held-out people and W1 to their donations"),
                       ("control", "a few steps with reward = the pitch mentions children, per learning rate"),
                       ("verdicts", "the pre-registered signatures, held or not, from a finished grid")):
        p = sub.add_parser(name, help=text)
        if name == "sims":
            p.add_argument("--data-dir", default="../shared/data/p4g")
            continue
        p.add_argument("--configs", default=CONFIGS, help="the experiment's config directory")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a value of every config (repeatable)")
        if name != "verdicts":
            p.add_argument("--out", help="output directory (default runs/p4g-pitch/<command>)")
    sub.choices["pilot"].add_argument("--pitches", type=int, default=256, help="pitches sampled from the persuader")
    sub.choices["pilot"].add_argument("--personas", type=int, default=4, help="train personas each pitch is scored on")
    sub.choices["pilot"].add_argument("--simulators", help="comma-separated: score under these simulators only")
    sub.choices["cards"].add_argument("--dialogues", type=int, default=48, help="held-out dialogues for the perplexity")
    sub.choices["control"].add_argument("--lrs", default="1e-4,3e-4", help="comma-separated learning rates")
    sub.choices["control"].add_argument("--steps", type=int, default=8)
    sub.choices["verdicts"].add_argument("--grid", default="runs/p4g-pitch/grid", help="the grid's output directory")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from . import pilot, verdicts

    if a.cmd == "sims":
        sims(a.data_dir)
    elif a.cmd == "pilot":
        pilot.pilot(a.configs, a.out or "runs/p4g-pitch/pilot", n_sampled=a.pitches, n_personas=a.personas,
                    overrides=a.set, only=a.simulators.split(",") if a.simulators else None, log=log)
    elif a.cmd == "cards":
        pilot.fidelity(a.configs, a.out or "runs/p4g-pitch/cards", n_dialogues=a.dialogues, overrides=a.set, log=log)
    elif a.cmd == "control":
        pilot.positive_control(a.configs, a.out or "runs/p4g-pitch/control",
                               lrs=tuple(float(x) for x in a.lrs.split(",")), steps=a.steps, overrides=a.set, log=log)
    else:
        print(verdicts.verdicts_markdown(verdicts.verdicts(a.grid, a.configs, overrides=a.set, log=log)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
