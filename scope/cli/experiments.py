"""The commands of experiments and their tools: ``grid`` (an experiment's arms x seeds, ``scope.grid``), ``sim``
(simulators fitted to people) and ``personas`` (evolved persona generators)."""
from __future__ import annotations

import argparse
import os

from .common import FILES, UsageError, add_set, log


def add_parsers(sub: argparse._SubParsersAction) -> None:
    for add in (add_grid, add_sim, add_personas):
        add(sub)


def add_grid(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("grid", help="an experiment's arms x seeds (grid.yaml), a held-out table and curves")
    g.add_argument("--configs", required=True, metavar="DIR", help="the experiment's config directory, with its "
                   "grid.yaml (e.g. recipes/collapse_lab/configs)")
    g.add_argument("--quick", action="store_true", help="what grid.yaml's `quick` says (e.g. one seed, half the steps)")
    g.add_argument("--out", help="output directory (default runs/<experiment>, or runs/<experiment>-quick)")
    g.add_argument("--seeds", type=int, help="seeds per arm (default: grid.yaml's)")
    g.add_argument("--arms", help="comma-separated subset of the grid's arms (default: every arm, or grid.yaml's runs)")
    add_set(g, "override a key in every run, e.g. --set models.collapsed.options.collapse=0.8")
    g.add_argument("--records", metavar="DIR", help="a directory of committed run records: those missing from "
                   "--out are restored first and count as done, and each run finished here is packed into it "
                   "(OUT/<arm>/seed<k> without its weights, one reproducible .tar.gz per run)")
    g.set_defaults(fn=grid, user_errors=(ValueError,))


def grid(args: argparse.Namespace) -> int:
    from ..grid.runner import run_grid
    from ..grid.table import table

    name = os.path.basename(os.path.normpath(args.configs))
    if name == "configs":  # recipes/<name>/configs
        name = os.path.basename(os.path.dirname(os.path.normpath(args.configs)))
    out = args.out or os.path.join("runs", name + ("-quick" if args.quick else ""))
    res = run_grid(args.configs, out, arms=tuple(args.arms.split(",")) if args.arms else None, seeds=args.seeds,
                   overrides=args.set, quick=args.quick, log=log, records=args.records)
    print(table(res, res["labels"]))
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
    sf.add_argument("--examples", metavar="MODULE:FUNCTION", help="what each real dialogue is fitted as: a function "
                    "of a scope.data.p4g.HumanDialogue returning chat views (default scope.envs.p4g:fit_views, the "
                    "P4G environment's persuadee view; an experiment supplies its own)")
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
                              ("examples", args.examples), ("max_tokens", args.max_tokens)) if v is not None}
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
    from ..personas.search import evolve
    from ..personas.config import load_search_config

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
    from ..personas.config import load_search_config
    from ..personas.search import score_sets

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
