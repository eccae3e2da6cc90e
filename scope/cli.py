"""The ``scope`` command line."""
from __future__ import annotations

import argparse
import os
import sys

from .config import ConfigError, load_config


def cmd_train(args: argparse.Namespace) -> int:
    from .train import train

    if args.resume:
        cfg_path = os.path.join(args.resume, "config.yaml")
        if not os.path.exists(cfg_path):
            print(f"error: {args.resume} has no config.yaml; is it a run directory?", file=sys.stderr)
            return 2
        cfg = load_config(cfg_path, args.set)
        cfg.run.dir = args.resume
    elif args.config:
        cfg = load_config(args.config, args.set)
    else:
        print("error: give --config FILE or --resume RUN_DIR", file=sys.stderr)
        return 2
    from .guards import RunFailed, StartupError

    try:
        train(cfg, resume=bool(args.resume), log=lambda s: print(s, flush=True))
    except StartupError as e:  # nothing was written
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .config import dump_config

    cfg = load_config(args.config, args.set)
    print(dump_config(cfg))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .eval import evaluate, frozen_refs, load_panel, markdown, write_results
    from .policy import load_policy

    cfg, backends, agent = load_policy(args.policy, args.config, args.model, args.set)
    panel = load_panel(args.panel)
    if args.episodes:
        panel.episodes = args.episodes
    if args.temperature is not None:
        panel.temperature = args.temperature
    models = dict(cfg.models)
    models.update(panel.models)
    refs = frozen_refs(models, backends, cfg.run.seed)
    from .setup import build_judge

    from .panels import run_sharing

    res = evaluate(agent, panel, refs, cfg.env.name, cfg.env.options, args.split, max_context=cfg.rollout.max_context,
                   end_on_truncation=cfg.rollout.end_on_truncation, judge=build_judge(cfg, backends),
                   sharing=run_sharing(cfg, panel))
    title = f"{args.policy} on {os.path.basename(args.panel)} ({args.split})"
    write_results(res, args.out, title)
    print(markdown(res, title))
    print(f"wrote {args.out}/eval.json, eval.md, eval_episodes.jsonl")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    import json

    from .eval import diagnose, frozen_refs
    from .partners.binding import spec_binding

    cfg = load_config(args.spec, args.set)
    refs = frozen_refs(cfg.models, {}, cfg.run.seed)
    agent = spec_binding(cfg.agent, refs[cfg.agent.model])
    partner = spec_binding(cfg.partner, refs[cfg.partner.model])
    res = diagnose(agent, partner, cfg.env.name, cfg.env.options, args.split, n_tasks=args.tasks, group=args.group,
                   resamples=args.resamples, seed=cfg.run.seed, end_on_truncation=cfg.rollout.end_on_truncation)
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from .plot import plot_runs

    for p in plot_runs(args.runs, args.out):
        print(p)
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from .envs.tau2.fetch import fetch

    files = fetch(args.dir)
    print(f"wrote {len(files)} files under {args.dir}; use env.options.data_dir: {args.dir} or SCOPE_TAU2_DATA")
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    from .lab.runner import run_lab

    paradigms = tuple(args.paradigms.split(",")) if args.paradigms else None
    out = args.out or ("runs/lab-quick" if args.quick else "runs/lab")
    from .guards import RunFailed, StartupError

    try:
        if args.sweep:
            from .lab.sweep import parse_sweep, run_sweep

            key, values = parse_sweep(args.sweep)
            res = run_sweep(args.out or f"runs/lab-sweep/{key.split('.')[-1]}", key, values, paradigms,
                            seeds=args.seeds, overrides=args.set, quick=args.quick, configs=args.configs,
                            log=lambda s: print(s, flush=True))
            from .lab.sweep import sweep_table

            print(sweep_table(res))
            return 0
        res = run_lab(out, configs=args.configs, paradigms=paradigms, seeds=args.seeds, overrides=args.set,
                      quick=args.quick, log=lambda s: print(s, flush=True))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (StartupError, RunFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, StartupError) else 1
    from .lab.runner import table

    print(table(res))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .models.local import load_backend
    from .models.server import check_bind, make_server

    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not key:
        print(f"error: --api-key-env {args.api_key_env}: that variable is not set", file=sys.stderr)
        return 2
    try:
        check_bind(args.host, key)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    b = load_backend(args.model, seed=args.seed)
    if args.adapter:
        from peft import PeftModel

        b.model = PeftModel.from_pretrained(b.model, args.adapter, adapter_name="served")
        b.versions["served"] = 0
        orig = b.generate
        # every request is served with the adapter (an instance attribute over the method, on purpose)
        b.generate = lambda prompts, sampling, adapter=None, sessions=None: (  # type: ignore[method-assign]
            orig(prompts, sampling, "served", sessions))
    srv = make_server(b, host=args.host, port=args.port, model_name=args.name or args.model,
                      fail_rate=args.fail_rate, seed=args.seed, max_batch=args.max_batch, api_key=key,
                      max_body_bytes=args.max_body_bytes).start()
    host, port = srv.server_address
    print(f"serving {args.model} at http://{host}:{port}/v1 (chat completions)"
          + (" (API key required)" if key else ""), flush=True)
    srv.wait()
    return 0


def cmd_personas(args: argparse.Namespace) -> int:
    from .personas.search import evolve, load_search_config, score_sets

    try:
        if args.personas_cmd == "evolve":
            if bool(args.config) == bool(args.resume):
                raise ConfigError("give --config CONFIG (a new search) or --resume RUN_DIR (continue one)")
            path = args.config or os.path.join(args.resume, "config.yaml")
            cfg = load_search_config(path, args.set)
            if args.resume:
                cfg.run["dir"] = args.resume
            state = evolve(cfg, resume=bool(args.resume))
            print(f"wrote {cfg.run_dir}/personas.json (the best generator's personas) and state.json "
                  f"({len(state['archive'])} elites)")
            return 0
        cfg = load_search_config(args.config, args.set)
        rows = score_sets(cfg, args.personas, dialogues=args.dialogues, seed=args.seed, run_dir=args.run)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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


def cmd_study(args: argparse.Namespace) -> int:
    if args.study_cmd == "analyze":
        from .study.analyze import run
        from .study.config import load_study

        cfg = load_study(args.config) if args.config else None
        try:
            run(args.db, args.out, conditions=list(cfg.conditions) if cfg else None,
                comparisons=cfg.comparisons() if cfg else None,
                outcomes=cfg.analysis.outcomes if cfg else None,
                resamples=cfg.analysis.resamples if cfg else args.resamples, seed=cfg.analysis.seed if cfg else 0)
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.out}/report.md, analysis.json, PNG plots and CSV exports")
        return 0
    from .study.serve import serve

    return serve(args.config, host=args.host, port=args.port)


def cmd_sim(args: argparse.Namespace) -> int:
    from .config import ConfigError as _CE

    if args.sim_cmd == "fit":
        from .sim.fit import FitConfig, fit

        opts = {k: v for k, v in (("model", args.model), ("data_dir", args.data_dir), ("out", args.out),
                                  ("epochs", args.epochs), ("lr", args.lr), ("max_dialogues", args.max_dialogues),
                                  ("seed", args.seed), ("shard", args.shard), ("shard_seed", args.shard_seed),
                                  ("form", args.form), ("max_tokens", args.max_tokens),
                                  ("decisions", args.decisions or None)) if v is not None}
        if args.quick:  # a few steps on a few dialogues: keeps the command working in the test suite
            opts = {"max_dialogues": 8, "epochs": 1.0, "max_tokens": 768, "batch_tokens": 768, **opts}
        try:
            cfg = FitConfig(**opts)
            fit(cfg, log=lambda s: print(s, flush=True), progress=not args.no_progress)
        except (FileNotFoundError, ValueError, _CE) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    from .sim.measure import measure, table, write

    try:
        m = measure(args.adapter, model=args.model or "smollm2-135m", data_dir=args.data_dir,
                    dialogues=args.dialogues, ppl_dialogues=args.ppl_dialogues, persona_config=args.persona_config,
                    seed=args.seed or 0, log=lambda s: print(s, flush=True))
    except (FileNotFoundError, ValueError, _CE) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {write(m, args.out or os.path.join(os.path.dirname(os.path.normpath(args.adapter)), 'measure'))}")
    print(table(m))
    return 0


def cmd_pitch(args: argparse.Namespace) -> int:
    """P4G-pitch's pilot, fidelity cards, positive control and verdicts (scope.lab.pitch)."""
    from . import config as _config
    from .lab import pitch

    log = lambda s: print(s, flush=True)  # noqa: E731
    try:
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
            from .lab import pitch_verdicts

            res = pitch_verdicts.verdicts(args.grid, args.configs, overrides=args.set, log=log)
            print(pitch_verdicts.verdicts_markdown(res))
    except (FileNotFoundError, ValueError, _config.ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_envsim(args: argparse.Namespace) -> int:
    from .envsim import bench
    from .envsim.simulate import ExactSimulator, ModelSimulator, NoChangeSimulator, NoisyOracle, Simulator

    try:
        samples = bench.load_bench(args.data_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
            from .config import ModelConfig
            from .eval import frozen_refs
            from .partners.binding import Binding
            from .types import SamplingParams

            mc = ModelConfig(path=args.model, backend="openai", base_url=args.base_url, model_name=args.model_name,
                             api_key_env=args.api_key_env) if args.base_url else ModelConfig(path=args.model)
            ref = frozen_refs({"envsim": mc}, {}, args.seed)["envsim"]
            b = Binding(id=args.model_name or args.model, ref=ref,
                        sampling=SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens))
            sims.append(ModelSimulator(b, batch=args.batch))
            if args.constrained:
                sims.append(ModelSimulator(b, constrained=True, batch=args.batch))
    results = [bench.run(s, samples, log=lambda m: print(m, flush=True)) for s in sims]
    path = bench.write(results, args.out)
    print(bench.table(results))
    print(f"wrote {path} and bench.png")
    return 0


def cmd_koth(args: argparse.Namespace) -> int:
    if args.koth_cmd == "train":
        from .koth.skills import train as train_skills

        steps = {k: v for k, v in (("skill", args.skill_steps), ("flat", args.flat_steps)) if v}
        paths = train_skills(steps=steps or None, out=args.out, log=lambda s: print(s, flush=True))
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
        return 0
    if args.koth_cmd == "replay":
        from .koth import replay
        from .koth.env import make_team

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
    from .koth import tournament

    teams = args.teams.split(",")
    agents = {}
    for t in teams:
        if t == "llm" or t.startswith("llm:"):
            from .partners.binding import Binding
            from .policy import load_policy
            from .types import SamplingParams

            policy = "base" if t == "llm" else t[4:]
            _, _, b = load_policy(policy, args.config, args.model if policy == "base" else None, [])
            agents[t] = Binding(id=t, ref=b.ref, sampling=SamplingParams(temperature=args.temperature,
                                                                           max_new_tokens=24))
        elif t not in tournament.FIXED:
            print(f"error: unknown team {t!r}; choose from {', '.join(tournament.FIXED)}, llm, llm:<checkpoint>",
                  file=sys.stderr)
            return 2
    res = tournament.run(teams, args.games, args.seed, agents, log=lambda s: print(s, flush=True), every=args.every,
                         prefix=args.prefix, parse=args.parse)
    print(f"wrote {tournament.write(res, args.out)}")
    print(tournament.table(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scope", description="Multi-turn RL for LLM agents against LLM partners.")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train from a YAML config, or resume a run directory")
    t.add_argument("--config", help="YAML config file")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.steps=5 (repeatable)")
    t.set_defaults(fn=cmd_train)
    c = sub.add_parser("check-config", help="validate a config and print it with all defaults")
    c.add_argument("config")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    c.set_defaults(fn=cmd_check)
    v = sub.add_parser("serve", help="serve a local model as an OpenAI-compatible chat-completions endpoint")
    v.add_argument("--model", required=True, help="smollm2-135m, tiny-random or a checkpoint directory")
    v.add_argument("--adapter", help="a PEFT adapter directory to serve on top of the model")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--host", default="127.0.0.1", help="bind address; anything but loopback needs --api-key-env")
    v.add_argument("--api-key-env", help="an environment variable holding the API key every request must carry")
    v.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body accepted")
    v.add_argument("--name", help="the model name the endpoint reports")
    v.add_argument("--max-batch", type=int, default=32)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--fail-rate", type=float, default=0.0,
                   help="answer this share of requests with 503 (fault-injection testing)")
    v.set_defaults(fn=cmd_serve)
    e = sub.add_parser("eval", help="evaluate a policy against a panel of partners (seen / unseen)")
    e.add_argument("--policy", required=True, help="a checkpoint directory (RUN_DIR/checkpoints/step_N, "
                   "RUN_DIR/best) or 'base'")
    e.add_argument("--panel", required=True, help="panel YAML: partners marked seen/unseen")
    e.add_argument("--split", default="test")
    e.add_argument("--config", help="run config (default: the checkpoint's)")
    e.add_argument("--model", help="override the agent's model path")
    e.add_argument("--episodes", type=int, help="episodes per partner (default: the panel's)")
    e.add_argument("--temperature", type=float, help="agent temperature (default: the panel's, 0)")
    e.add_argument("--out", default="eval_out")
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    e.set_defaults(fn=cmd_eval)
    d = sub.add_parser("diagnose", help="measure a partner's collapse without training")
    d.add_argument("spec", help="YAML with models, partner (the spec to diagnose), agent and env")
    d.add_argument("--split", default="train")
    d.add_argument("--tasks", type=int, default=4)
    d.add_argument("--group", type=int, default=8, help="rollouts per task")
    d.add_argument("--resamples", type=int, default=4, help="partner resamples per dialogue (variance split)")
    d.add_argument("--out", help="also write the JSON here")
    d.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    d.set_defaults(fn=cmd_diagnose)
    da = sub.add_parser("data", help="fetch benchmark data files")
    da.add_argument("name", choices=["tau2"])
    da.add_argument("dir", nargs="?", default="data/tau2")
    da.set_defaults(fn=cmd_data)
    lb = sub.add_parser("lab", help="the collapse lab: every paradigm x seeds, a held-out table and curves")
    lb.add_argument("--quick", action="store_true", help="one seed, half the steps (about 4 minutes here once the "
                    "lab's models are built; building them takes about 9 minutes, once)")
    lb.add_argument("--out", help="output directory (default runs/lab, or runs/lab-quick)")
    lb.add_argument("--seeds", type=int, default=3)
    lb.add_argument("--paradigms", help="comma-separated subset of base,single,ensemble,persona,persona_evolved,"
                    "vs,cotrain,population (default: those with a config in --configs)")
    lb.add_argument("--configs", default="configs/lab", help="the directory of the lab's configs")
    lb.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key in every run, e.g. --set models.collapsed.options.collapse=0.8")
    lb.add_argument("--sweep", metavar="KEY=V1,V2,...", help="run the grid once per value of one knob and tabulate "
                    "where each cure stops working, e.g. --sweep models.collapsed.options.vs_fidelity=0,0.5,1 "
                    "--paradigms single,vs --seeds 1 (output runs/lab-sweep/<knob>/)")
    lb.set_defaults(fn=cmd_lab)
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
    ev_.set_defaults(fn=cmd_envsim)
    ko = sub.add_parser("koth", help="2v2 King of the Hill: RL skills, a behaviour tree, an LLM controller")
    ks = ko.add_subparsers(dest="koth_cmd", required=True)
    kt = ks.add_parser("train", help="train the four RL skills and the flat RL team with PPO (cached)")
    kt.add_argument("--skill-steps", type=int, help="environment steps per skill")
    kt.add_argument("--flat-steps", type=int, help="environment steps of the flat team")
    kt.add_argument("--out", help="where to write them (default $SCOPE_CACHE/koth/<settings hash>; the package "
                                  "ships a trained set, used while it matches the settings)")
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
    kr = ks.add_parser("replay", help="GIF replays of games between two fixed teams, and a viewer page")
    kr.add_argument("--teams", default="bt,flat")
    kr.add_argument("--seeds", default="0,1,2")
    kr.add_argument("--out", default="runs/koth/replays")
    kr.add_argument("--skills", choices=["rl", "scripted"], default="rl",
                    help="the random picker's skills: the RL ones (trained on first use) or the plain ones")
    ko.set_defaults(fn=cmd_koth)
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
    si.set_defaults(fn=cmd_sim)
    pi = sub.add_parser("pitch", help="P4G-pitch: the pilot, the simulators' fidelity cards, the positive control "
                        "and the verdicts of the pre-registered signatures (docs/p4g_pitch/README.md)")
    ps = pi.add_subparsers(dest="pitch_cmd", required=True)
    for name, text in (("pilot", "score sampled and written pitches under every simulator; the go/no-go"),
                       ("cards", "each simulator's perplexity of held-out people and W1 to their donations"),
                       ("control", "a few steps with reward = the pitch mentions children, per learning rate"),
                       ("verdicts", "the pre-registered signatures, held or not, from a finished grid")):
        sp_ = ps.add_parser(name, help=text)
        sp_.add_argument("--configs", default="configs/p4g_pitch", help="the experiment's config directory")
        sp_.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a value of every config (repeatable)")
        if name != "verdicts":
            sp_.add_argument("--out", help="output directory (default runs/p4g-pitch/<command>)")
    ps.choices["pilot"].add_argument("--pitches", type=int, default=256, help="pitches sampled from the persuader")
    ps.choices["pilot"].add_argument("--personas", type=int, default=4, help="train personas each pitch is scored on")
    ps.choices["pilot"].add_argument("--simulators", help="comma-separated: score under these simulators only")
    ps.choices["cards"].add_argument("--dialogues", type=int, default=48, help="held-out dialogues for the perplexity")
    ps.choices["control"].add_argument("--lrs", default="1e-4,3e-4", help="comma-separated learning rates")
    ps.choices["control"].add_argument("--steps", type=int, default=8)
    ps.choices["verdicts"].add_argument("--grid", default="runs/p4g-pitch/grid", help="the grid's output directory")
    pi.set_defaults(fn=cmd_pitch)
    pe = sub.add_parser("personas", help="evolved persona generators: search, and score persona sets")
    ps = pe.add_subparsers(dest="personas_cmd", required=True)
    pv = ps.add_parser("evolve", help="MAP-Elites over persona generators (fitness from played dialogues)")
    pv.add_argument("--config", help="persona search YAML")
    pv.add_argument("--resume", metavar="RUN_DIR", help="continue the search in RUN_DIR")
    pv.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pc = ps.add_parser("score", help="human-likeness and coverage of persona sets beside real held-out humans")
    pc.add_argument("--config", required=True, help="persona search YAML (models, env, humans, search.k)")
    pc.add_argument("--personas", action="append", required=True,
                    help="a persona file (repeatable): evolved personas.json, builtin, or a JSON list of {id, text}")
    pc.add_argument("--run", help="a search's RUN_DIR: reuse its human-likeness classifier")
    pc.add_argument("--dialogues", type=int, default=32, help="dialogues per set (and real humans drawn)")
    pc.add_argument("--seed", type=int, default=1)
    pc.add_argument("--out", help="also write the rows as JSON")
    pc.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pe.set_defaults(fn=cmd_personas)

    st = sub.add_parser("study", help="the human study: serve the chat app, analyse its database")
    ss = st.add_subparsers(dest="study_cmd", required=True)
    sv = ss.add_parser("serve", help="serve the participant page and its API")
    sv.add_argument("--config", required=True, help="study YAML (tasks, conditions, database)")
    sv.add_argument("--host", help="bind address (default: the config's, 127.0.0.1)")
    sv.add_argument("--port", type=int, help="port (default: the config's, 8080)")
    sa = ss.add_parser("analyze", help="statistics, report, plots and CSV exports of a study database")
    sa.add_argument("db", help="the SQLite file (or an SQLAlchemy URL)")
    sa.add_argument("--config", help="the study YAML (conditions order, pre-registered comparisons and outcomes)")
    sa.add_argument("--out", default="study_report")
    sa.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (without --config)")
    st.set_defaults(fn=cmd_study)

    pl = sub.add_parser("plot", help="PNG figures and a score table of one or more runs")
    pl.add_argument("runs", nargs="+")
    pl.add_argument("--out", default="plots")
    pl.set_defaults(fn=cmd_plot)
    args = p.parse_args(argv)
    _quiet_libraries()
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _quiet_libraries() -> None:
    """scope prints its own progress: the libraries' loading and saving progress bars are turned off."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


if __name__ == "__main__":
    sys.exit(main())
