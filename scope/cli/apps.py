"""The applications' commands: ``study`` (the human study), ``envsim`` (environment simulation) and ``koth``
(King of the Hill)."""
from __future__ import annotations

import argparse
import os

from .common import FILES, UsageError, log



def add_parsers(sub: argparse._SubParsersAction) -> None:
    for add in (add_envsim, add_koth, add_study):
        add(sub)


def add_study(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("study", help="the human study: serve the chat app, analyse its database")
    ss = st.add_subparsers(dest="study_cmd", required=True)
    sv = ss.add_parser("serve", help="serve the participant page and its API")
    sv.add_argument("--config", required=True, help="study YAML (tasks, conditions, database)")
    sv.add_argument("--host", help="bind address (default: the config's, 127.0.0.1)")
    sv.add_argument("--port", type=int, help="port (default: the config's, 8080)")
    sv.set_defaults(fn=study_serve, user_errors=())
    sa = ss.add_parser("analyze", help="statistics, report, plots and CSV exports of a study database")
    sa.add_argument("db", help="the SQLite file (or an SQLAlchemy URL)")
    sa.add_argument("--config", help="the study YAML (conditions order, pre-registered comparisons and outcomes)")
    sa.add_argument("--out", default="study_report")
    sa.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (without --config)")
    sa.set_defaults(fn=study_analyze, user_errors=FILES)


def study_serve(args: argparse.Namespace) -> int:
    from ..study.serve import serve

    return serve(args.config, host=args.host, port=args.port)


def study_analyze(args: argparse.Namespace) -> int:
    from ..study.analyze import run
    from ..study.config import load_study

    cfg = load_study(args.config) if args.config else None
    run(args.db, args.out, conditions=list(cfg.conditions) if cfg else None,
        comparisons=cfg.comparisons() if cfg else None, outcomes=cfg.analysis.outcomes if cfg else None,
        resamples=cfg.analysis.resamples if cfg else args.resamples, seed=cfg.analysis.seed if cfg else 0)
    print(f"wrote {args.out}/report.md, analysis.json, PNG plots and CSV exports")
    return 0


def add_envsim(sub: argparse._SubParsersAction) -> None:
    ev_ = sub.add_parser("envsim", help="environment simulation: how well a model plays tau2's tools")
    es = ev_.add_subparsers(dest="envsim_cmd", required=True)
    eb = es.add_parser("bench", help="score simulators on the 400-sample benchmark (scope/envsim/data/bench.json), "
                       "rebuilt from the tau2 data: FM, CM strict/lenient, per axis, the cliff")
    eb.add_argument("--simulator", action="append", choices=["model", "exact", "nochange", "noisy"],
                    help="repeatable; default: model")
    eb.add_argument("--model", default="smollm2-135m", help="a local model (default the embedded SmolLM2)")
    eb.add_argument("--base-url", help="an OpenAI-compatible endpoint instead (with --model-name)")
    eb.add_argument("--model-name")
    eb.add_argument("--api-key-env", default="OPENAI_API_KEY")
    eb.add_argument("--constrained", action="store_true", help="also run the model in the constrained mode")
    eb.add_argument("--temperature", type=float, default=0.0)
    eb.add_argument("--max-new-tokens", type=int, default=256)
    eb.add_argument("--batch", type=int, default=16, help="samples per model call (memory grows with it)")
    eb.add_argument("--limit", type=int, help="score this many samples, spread over the strata")
    eb.add_argument("--data-dir", help="the tau2 data (default SCOPE_TAU2_DATA)")
    eb.add_argument("--seed", type=int, default=0)
    eb.add_argument("--out", default="runs/envsim")
    eb.set_defaults(fn=envsim_bench, user_errors=FILES)


def envsim_bench(args: argparse.Namespace) -> int:
    from ..envsim import bench
    from ..envsim.simulate import ExactSimulator, ModelSimulator, NoChangeSimulator, NoisyOracle, Simulator

    samples = bench.load_bench(args.data_dir)
    if args.limit:
        samples = samples[::max(1, len(samples) // args.limit)][:args.limit]  # spread over the strata
    sims: list[Simulator] = []
    for kind in args.simulator or ["model"]:
        if kind == "exact":
            sims.append(ExactSimulator())
        elif kind == "nochange":
            sims.append(NoChangeSimulator())
        elif kind == "noisy":
            sims.append(NoisyOracle(seed=args.seed))
        else:
            from ..config import ModelConfig
            from ..models.loading import frozen_refs
            from ..partners.binding import Binding
            from ..types import SamplingParams

            mc = ModelConfig(path=args.model, backend="openai", base_url=args.base_url, model_name=args.model_name,
                             api_key_env=args.api_key_env) if args.base_url else ModelConfig(path=args.model)
            ref = frozen_refs({"envsim": mc}, {}, args.seed)["envsim"]
            b = Binding(id=args.model_name or args.model, ref=ref,
                        sampling=SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens))
            sims.append(ModelSimulator(b, batch=args.batch))
            if args.constrained:
                sims.append(ModelSimulator(b, constrained=True, batch=args.batch))
    results = [bench.run(s, samples, log=log) for s in sims]
    path = bench.write(results, args.out)
    print(bench.table(results))
    print(f"wrote {path} and bench.png")
    return 0


def add_koth(sub: argparse._SubParsersAction) -> None:
    ko = sub.add_parser("koth", help="2v2 King of the Hill: RL skills, a behaviour tree, an LLM controller")
    ks = ko.add_subparsers(dest="koth_cmd", required=True)
    kt = ks.add_parser("train", help="train the four RL skills and the flat RL team with PPO (cached)")
    kt.add_argument("--skill-steps", type=int, help="environment steps per skill")
    kt.add_argument("--flat-steps", type=int, help="environment steps of the flat team")
    kt.add_argument("--out", help="where to write them (default $SCOPE_CACHE/koth/<settings hash>; the package "
                                  "ships a trained set, used while it matches the settings)")
    kt.set_defaults(fn=koth_train, user_errors=())
    kn = ks.add_parser("tournament", help="every pair of teams for N games: win rates, intervals, tests")
    kn.add_argument("--teams", default="bt,flat,random,llm",
                    help="comma-separated: bt, flat, random, llm (the base model), llm:<checkpoint>")
    kn.add_argument("--games", type=int, default=100)
    kn.add_argument("--seed", type=int, default=0)
    kn.add_argument("--model", default="smollm2-135m", help="the LLM controller's base model")
    kn.add_argument("--config", help="the run config of llm:<checkpoint> teams (default: the checkpoint's)")
    kn.add_argument("--temperature", type=float, default=0.7)
    kn.add_argument("--every", type=int, default=10, help="ticks between an LLM controller's decisions")
    kn.add_argument("--prefix", default="", help="text every LLM controller reply starts with (e.g. '1: ')")
    kn.add_argument("--parse", choices=["strict", "lenient"], default="strict",
                    help="how an LLM controller's answers are read (see the koth environment)")
    kn.add_argument("--out", default="runs/koth")
    kn.set_defaults(fn=koth_tournament, user_errors=())
    kr = ks.add_parser("replay", help="GIF replays of games between two fixed teams, and a viewer page")
    kr.add_argument("--teams", default="bt,flat")
    kr.add_argument("--seeds", default="0,1,2")
    kr.add_argument("--out", default="runs/koth/replays")
    kr.add_argument("--skills", choices=["rl", "scripted"], default="rl",
                    help="the random picker's skills: the RL ones (trained on first use) or the plain ones")
    kr.set_defaults(fn=koth_replay, user_errors=())


def koth_train(args: argparse.Namespace) -> int:
    from ..koth.skills import train as train_skills

    steps = {k: v for k, v in (("skill", args.skill_steps), ("flat", args.flat_steps)) if v}
    paths = train_skills(steps=steps or None, out=args.out, log=log)
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


def koth_replay(args: argparse.Namespace) -> int:
    from ..koth import replay
    from ..koth.env import make_team

    a, b = args.teams.split(",")
    os.makedirs(args.out, exist_ok=True)
    recs = []
    for s in (int(x) for x in args.seeds.split(",")):
        rec = replay.record((make_team(a, args.skills, seed=s), make_team(b, args.skills, seed=s + 1)), seed=s)
        name = f"{a}_vs_{b}_seed{s}.gif"
        replay.gif(rec, os.path.join(args.out, name))
        recs.append((name, rec))
    print(f"wrote {replay.page(recs, args.out)}")
    return 0


def koth_tournament(args: argparse.Namespace) -> int:
    from ..koth import tournament

    teams = args.teams.split(",")
    agents = {}
    for t in teams:
        if t == "llm" or t.startswith("llm:"):
            from ..partners.binding import Binding
            from ..policy import load_policy
            from ..types import SamplingParams

            policy = "base" if t == "llm" else t[4:]
            _, _, b = load_policy(policy, args.config, args.model if policy == "base" else None, [])
            agents[t] = Binding(id=t, ref=b.ref, sampling=SamplingParams(temperature=args.temperature,
                                                                           max_new_tokens=24))
        elif t not in tournament.FIXED:
            raise UsageError(f"unknown team {t!r}; choose from {', '.join(tournament.FIXED)}, llm, llm:<checkpoint>")
    res = tournament.run(teams, args.games, args.seed, agents, log=log, every=args.every, prefix=args.prefix,
                         parse=args.parse)
    print(f"wrote {tournament.write(res, args.out)}")
    print(tournament.table(res))
    return 0
