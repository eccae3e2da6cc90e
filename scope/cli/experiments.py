"""The experiments' commands: ``lab`` (the collapse lab and its sweeps), ``pitch`` (P4G-pitch), ``sim``
(simulators fitted to people) and ``personas`` (evolved persona generators)."""
from __future__ import annotations

import argparse
import os

from .common import FILES, UsageError, add_set, log



def add_parsers(sub: argparse._SubParsersAction) -> None:
    for add in (add_lab, add_sim, add_pitch, add_personas):
        add(sub)


def add_lab(sub: argparse._SubParsersAction) -> None:
    lb = sub.add_parser("lab", help="the collapse lab: every paradigm x seeds, a held-out table and curves")
    lb.add_argument("--quick", action="store_true", help="one seed, half the steps (about 4 minutes here once the "
                    "lab's models are built; building them takes about 9 minutes, once)")
    lb.add_argument("--out", help="output directory (default runs/lab, or runs/lab-quick)")
    lb.add_argument("--seeds", type=int, default=3)
    lb.add_argument("--paradigms", help="comma-separated subset of base,single,ensemble,persona,persona_evolved,"
                    "vs,cotrain,population (default: those with a config in --configs)")
    lb.add_argument("--configs", default="configs/lab", help="the directory of the lab's configs")
    add_set(lb, "override a key in every run, e.g. --set models.collapsed.options.collapse=0.8")
    lb.add_argument("--records", metavar="DIR", help="a directory of committed run records: those missing from "
                    "--out are restored first and count as done, and each run finished here is packed into it "
                    "(OUT/<paradigm>/seed<k> without its weights, one reproducible .tar.gz per run)")
    lb.add_argument("--sweep", metavar="KEY=V1,V2,...", help="run the grid once per value of one knob and tabulate "
                    "where each cure stops working, e.g. --sweep models.collapsed.options.vs_fidelity=0,0.5,1 "
                    "--paradigms single,vs --seeds 1 (output runs/lab-sweep/<knob>/)")
    lb.set_defaults(fn=lab, user_errors=(ValueError,))


def lab(args: argparse.Namespace) -> int:
    from ..lab.runner import run_lab, table

    paradigms = tuple(args.paradigms.split(",")) if args.paradigms else None
    if args.sweep:
        from ..lab.sweep import parse_sweep, run_sweep, sweep_table

        key, values = parse_sweep(args.sweep)
        res = run_sweep(args.out or f"runs/lab-sweep/{key.split('.')[-1]}", key, values, paradigms,
                        seeds=args.seeds, overrides=args.set, quick=args.quick, configs=args.configs, log=log)
        print(sweep_table(res))
        return 0
    out = args.out or ("runs/lab-quick" if args.quick else "runs/lab")
    print(table(run_lab(out, configs=args.configs, paradigms=paradigms, seeds=args.seeds, overrides=args.set,
                        quick=args.quick, log=log, records=args.records)))
    return 0


def add_sim(sub: argparse._SubParsersAction) -> None:
    si = sub.add_parser("sim", help="simulators fitted to people: fit one on the P4G persuadees, measure it")
    ss = si.add_subparsers(dest="sim_cmd", required=True)
    sf = ss.add_parser("fit", help="LoRA-fit a simulator on the real P4G persuadees' turns (train split); "
                       "writes OUT/adapter and OUT/fit.json (cached by data and options, resumable)")
    sf.add_argument("--model", help="the model to fit (default smollm2-135m)")
    sf.add_argument("--data-dir", help="the P4G data directory (default SCOPE_P4G_DATA)")
    sf.add_argument("--out", help="output directory (default runs/sim-p4g)")
    sf.add_argument("--epochs", type=float)
    sf.add_argument("--lr", type=float)
    sf.add_argument("--max-dialogues", type=int, help="fit on the first N train dialogues only")
    sf.add_argument("--shard", help="k/n: the k-th of n disjoint random parts of the train persuadees only")
    sf.add_argument("--shard-seed", type=int, help="the seed of the parts (default 0)")
    sf.add_argument("--form", choices=["p4g", "pitch"], help="the persuadee's system prompt: P4G's full persona "
                    "(default) or P4G-pitch's short one")
    sf.add_argument("--decisions", action="store_true", help="add a forced-decision example per dialogue with the "
                    "participant's actual donation (P4G-pitch's format)")
    sf.add_argument("--max-tokens", type=int, help="tokens per example window (default 1024)")
    sf.add_argument("--seed", type=int)
    sf.add_argument("--quick", action="store_true", help="a few steps on 8 dialogues (a smoke run)")
    sf.add_argument("--no-progress", action="store_true", help="a line per tenth of the run instead of a bar")
    sf.set_defaults(fn=sim_fit, user_errors=FILES)
    sm = ss.add_parser("measure", help="the fitted simulator against the base one on held-out people: "
                       "perplexity, donations, human-likeness and coverage")
    sm.add_argument("--adapter", required=True, help="the adapter of a fit (e.g. runs/sim-p4g/adapter)")
    sm.add_argument("--model", help="its base model (default smollm2-135m)")
    sm.add_argument("--data-dir", help="the P4G data directory (default SCOPE_P4G_DATA)")
    sm.add_argument("--dialogues", type=int, default=64, help="simulated dialogues per simulator")
    sm.add_argument("--ppl-dialogues", type=int, default=64, help="held-out dialogues for the perplexity")
    sm.add_argument("--persona-config", default="configs/personas/evolve.yaml",
                    help="the persona search config whose classifier settings are used")
    sm.add_argument("--seed", type=int)
    sm.add_argument("--out", help="output directory (default: beside the adapter, measure/)")
    sm.set_defaults(fn=sim_measure, user_errors=FILES)


def sim_fit(args: argparse.Namespace) -> int:
    from ..sim.fit import FitConfig, fit

    opts = {k: v for k, v in (("model", args.model), ("data_dir", args.data_dir), ("out", args.out),
                              ("epochs", args.epochs), ("lr", args.lr), ("max_dialogues", args.max_dialogues),
                              ("seed", args.seed), ("shard", args.shard), ("shard_seed", args.shard_seed),
                              ("form", args.form), ("max_tokens", args.max_tokens),
                              ("decisions", args.decisions or None)) if v is not None}
    if args.quick:  # a few steps on a few dialogues: keeps the command working in the test suite
        opts = {"max_dialogues": 8, "epochs": 1.0, "max_tokens": 768, "batch_tokens": 768, **opts}
    fit(FitConfig(**opts), log=log, progress=not args.no_progress)
    return 0


def sim_measure(args: argparse.Namespace) -> int:
    from ..sim.measure import measure, table, write

    m = measure(args.adapter, model=args.model or "smollm2-135m", data_dir=args.data_dir, dialogues=args.dialogues,
                ppl_dialogues=args.ppl_dialogues, persona_config=args.persona_config, seed=args.seed or 0, log=log)
    print(f"wrote {write(m, args.out or os.path.join(os.path.dirname(os.path.normpath(args.adapter)), 'measure'))}")
    print(table(m))
    return 0


def add_pitch(sub: argparse._SubParsersAction) -> None:
    pi = sub.add_parser("pitch", help="P4G-pitch: the pilot, the simulators' fidelity cards, the positive control "
                        "and the verdicts of the pre-registered signatures (docs/p4g_pitch/README.md)")
    ps = pi.add_subparsers(dest="pitch_cmd", required=True)
    for name, text in (("pilot", "score sampled and written pitches under every simulator; the go/no-go"),
                       ("cards", "each simulator's perplexity of held-out people and W1 to their donations"),
                       ("control", "a few steps with reward = the pitch mentions children, per learning rate"),
                       ("verdicts", "the pre-registered signatures, held or not, from a finished grid")):
        sp_ = ps.add_parser(name, help=text)
        sp_.add_argument("--configs", default="configs/p4g_pitch", help="the experiment's config directory")
        add_set(sp_, "override a value of every config (repeatable)")
        if name != "verdicts":
            sp_.add_argument("--out", help="output directory (default runs/p4g-pitch/<command>)")
    ps.choices["pilot"].add_argument("--pitches", type=int, default=256, help="pitches sampled from the persuader")
    ps.choices["pilot"].add_argument("--personas", type=int, default=4, help="train personas each pitch is scored on")
    ps.choices["pilot"].add_argument("--simulators", help="comma-separated: score under these simulators only")
    ps.choices["cards"].add_argument("--dialogues", type=int, default=48, help="held-out dialogues for the perplexity")
    ps.choices["control"].add_argument("--lrs", default="1e-4,3e-4", help="comma-separated learning rates")
    ps.choices["control"].add_argument("--steps", type=int, default=8)
    ps.choices["verdicts"].add_argument("--grid", default="runs/p4g-pitch/grid", help="the grid's output directory")
    pi.set_defaults(fn=pitch, user_errors=FILES)


def pitch(args: argparse.Namespace) -> int:
    """P4G-pitch's pilot, fidelity cards, positive control and verdicts (scope.lab.pitch)."""
    from ..lab import pitch

    if args.pitch_cmd == "pilot":
        pitch.pilot(args.configs, args.out or "runs/p4g-pitch/pilot", n_sampled=args.pitches,
                    n_personas=args.personas, overrides=args.set,
                    only=args.simulators.split(",") if args.simulators else None, log=log)
    elif args.pitch_cmd == "cards":
        pitch.fidelity(args.configs, args.out or "runs/p4g-pitch/cards", n_dialogues=args.dialogues,
                       overrides=args.set, log=log)
    elif args.pitch_cmd == "control":
        pitch.positive_control(args.configs, args.out or "runs/p4g-pitch/control",
                               lrs=tuple(float(x) for x in args.lrs.split(",")), steps=args.steps,
                               overrides=args.set, log=log)
    else:
        from ..lab import pitch_verdicts

        print(pitch_verdicts.verdicts_markdown(pitch_verdicts.verdicts(args.grid, args.configs, overrides=args.set,
                                                                       log=log)))
    return 0


def add_personas(sub: argparse._SubParsersAction) -> None:
    pe = sub.add_parser("personas", help="evolved persona generators: search, and score persona sets")
    ps = pe.add_subparsers(dest="personas_cmd", required=True)
    pv = ps.add_parser("evolve", help="MAP-Elites over persona generators (fitness from played dialogues)")
    pv.add_argument("--config", help="persona search YAML")
    pv.add_argument("--resume", metavar="RUN_DIR", help="continue the search in RUN_DIR")
    add_set(pv)
    pv.set_defaults(fn=personas_evolve, user_errors=FILES)
    pc = ps.add_parser("score", help="human-likeness and coverage of persona sets beside real held-out humans")
    pc.add_argument("--config", required=True, help="persona search YAML (models, env, humans, search.k)")
    pc.add_argument("--personas", action="append", required=True,
                    help="a persona file (repeatable): evolved personas.json, builtin, or a JSON list of {id, text}")
    pc.add_argument("--run", help="a search's RUN_DIR: reuse its human-likeness classifier")
    pc.add_argument("--dialogues", type=int, default=32, help="dialogues per set (and real humans drawn)")
    pc.add_argument("--seed", type=int, default=1)
    pc.add_argument("--out", help="also write the rows as JSON")
    add_set(pc)
    pc.set_defaults(fn=personas_score, user_errors=FILES)


def personas_evolve(args: argparse.Namespace) -> int:
    from ..personas.search import evolve, load_search_config

    if bool(args.config) == bool(args.resume):
        raise UsageError("give --config CONFIG (a new search) or --resume RUN_DIR (continue one)")
    cfg = load_search_config(args.config or os.path.join(args.resume, "config.yaml"), args.set)
    if args.resume:
        cfg.run["dir"] = args.resume
    state = evolve(cfg, resume=bool(args.resume))
    print(f"wrote {cfg.run_dir}/personas.json (the best generator's personas) and state.json "
          f"({len(state['archive'])} elites)")
    return 0


def personas_score(args: argparse.Namespace) -> int:
    from ..personas.search import load_search_config, score_sets

    cfg = load_search_config(args.config, args.set)
    rows = score_sets(cfg, args.personas, dialogues=args.dialogues, seed=args.seed, run_dir=args.run)
    print("| persona set | personas | human-likeness | coverage | density | rejected | dialogues |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['set']} | {r['personas']} | {r['human']:.3f} | {r['coverage']:.3f} | {r['density']:.3f} | "
              f"{r['reject_frac']:.2f} | {r['n_dialogues']} |")
    print(f"(human-likeness classifier: held-out AUC {rows[0]['classifier_auc']:.3f})")
    if args.out:
        import json

        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
