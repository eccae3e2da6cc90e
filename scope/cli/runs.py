"""Commands around one run: ``train``, ``check-config``, ``eval``, ``diagnose``, ``plot``, ``data``, ``serve``,
``alarms``."""
from __future__ import annotations

import argparse
import os

from ..configfile import load_config
from .common import FILES, UsageError, add_set, log


def add_parsers(sub: argparse._SubParsersAction) -> None:
    for add in (add_train, add_check, add_serve, add_eval, add_diagnose, add_data, add_plot, add_alarms):
        add(sub)


def add_train(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train from a YAML config, or resume a run directory")
    t.add_argument("--config", help="YAML config file")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    add_set(t)
    t.set_defaults(fn=train, user_errors=())


def train(args: argparse.Namespace) -> int:
    from ..train import train as run_training

    if args.resume:
        cfg_path = os.path.join(args.resume, "config.yaml")
        if not os.path.exists(cfg_path):
            raise UsageError(f"{args.resume} has no config.yaml; is it a run directory?")
        cfg = load_config(cfg_path, args.set)
        cfg.run.dir = args.resume
    elif args.config:
        cfg = load_config(args.config, args.set)
    else:
        raise UsageError("give --config FILE or --resume RUN_DIR")
    run_training(cfg, resume=bool(args.resume), log=log)
    return 0


def add_check(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("check-config", help="validate a config and print it with all defaults")
    c.add_argument("config")
    add_set(c)
    c.set_defaults(fn=check, user_errors=())


def check(args: argparse.Namespace) -> int:
    from ..config import dump_config

    print(dump_config(load_config(args.config, args.set)))
    return 0


def add_serve(sub: argparse._SubParsersAction) -> None:
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
    v.add_argument("--header-seconds", type=float, default=10.0,
                   help="close a connection that has not sent a whole request head in this long")
    v.add_argument("--max-connections", type=int, default=1000,
                   help="open connections at most (one more closes the longest-waiting idle one)")
    v.set_defaults(fn=serve, user_errors=())


def serve(args: argparse.Namespace) -> int:
    from ..models.loading import load_backend
    from ..models.server import check_bind, make_server

    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not key:
        raise UsageError(f"--api-key-env {args.api_key_env}: that variable is not set")
    try:
        check_bind(args.host, key)
    except ValueError as e:
        raise UsageError(str(e)) from e
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
                      max_body_bytes=args.max_body_bytes, header_seconds=args.header_seconds,
                      max_connections=args.max_connections).start()
    host, port = srv.server_address
    log(f"serving {args.model} at http://{host}:{port}/v1 (chat completions)" + (" (API key required)" if key else ""))
    srv.wait()
    return 0


def add_eval(sub: argparse._SubParsersAction) -> None:
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
    add_set(e)
    e.set_defaults(fn=evaluate, user_errors=())


def evaluate(args: argparse.Namespace) -> int:
    from ..eval import evaluate as run_eval
    from ..eval import load_panel, markdown, write_results
    from ..models.loading import frozen_refs
    from ..panels import family_warning, run_sharing
    from ..policy import load_policy
    from ..setup import build_judge

    cfg, backends, agent = load_policy(args.policy, args.config, args.model, args.set)
    panel = load_panel(args.panel)
    if args.episodes:
        panel.episodes = args.episodes
    if args.temperature is not None:
        panel.temperature = args.temperature
    refs = frozen_refs({**cfg.models, **panel.models}, backends, cfg.run.seed)
    shared = run_sharing(cfg, panel)
    warning = family_warning(panel, shared)
    if warning:
        log(f"WARNING: {warning}")
    res = run_eval(agent, panel, refs, cfg.env, args.split, max_context=cfg.rollout.max_context,
                   end_on_truncation=cfg.rollout.end_on_truncation, judge=build_judge(cfg, backends),
                   sharing=shared, progress=lambda s: log(f"eval: {s}"))
    title = f"{args.policy} on {os.path.basename(args.panel)} ({args.split})"
    write_results(res, args.out, title)
    print(markdown(res, title))
    print(f"wrote {args.out}/eval.json, eval.md, eval_episodes.jsonl")
    return 0


def add_diagnose(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("diagnose", help="measure a partner's collapse without training")
    d.add_argument("spec", help="YAML with models, partner (the spec to diagnose), agent and env")
    d.add_argument("--split", default="train")
    d.add_argument("--tasks", type=int, default=4)
    d.add_argument("--group", type=int, default=8, help="rollouts per task")
    d.add_argument("--resamples", type=int, default=4, help="partner resamples per dialogue (variance split)")
    d.add_argument("--out", help="also write the JSON here")
    add_set(d)
    d.set_defaults(fn=diagnose, user_errors=())


def diagnose(args: argparse.Namespace) -> int:
    import json

    from ..eval import diagnose as run_diagnose
    from ..models.loading import frozen_refs
    from ..partners.binding import spec_binding

    cfg = load_config(args.spec, args.set)
    refs = frozen_refs(cfg.models, {}, cfg.run.seed)
    agent = spec_binding(cfg.agent, refs[cfg.agent.model])
    partner = spec_binding(cfg.partner, refs[cfg.partner.model])
    res = run_diagnose(agent, partner, cfg.env, args.split, n_tasks=args.tasks,
                       group=args.group, resamples=args.resamples, seed=cfg.run.seed,
                       end_on_truncation=cfg.rollout.end_on_truncation)
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def add_data(sub: argparse._SubParsersAction) -> None:
    da = sub.add_parser("data", help="fetch benchmark data files")
    da.add_argument("name", choices=["tau2"])
    da.add_argument("dir", nargs="?", default="data/tau2")
    da.set_defaults(fn=data, user_errors=())


def data(args: argparse.Namespace) -> int:
    from ..envs.tau2.fetch import fetch

    files = fetch(args.dir)
    print(f"wrote {len(files)} files under {args.dir}; use env.options.data_dir: {args.dir} or SCOPE_TAU2_DATA")
    return 0


def add_plot(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser("plot", help="PNG figures and a score table of one or more runs")
    pl.add_argument("runs", nargs="+")
    pl.add_argument("--out", default="plots")
    pl.set_defaults(fn=plot, user_errors=())


def plot(args: argparse.Namespace) -> int:
    from ..plot import plot_runs

    for p in plot_runs(args.runs, args.out):
        print(p)
    return 0


def add_alarms(sub: argparse._SubParsersAction) -> None:
    al = sub.add_parser("alarms", help="re-score a run's collapse alarms offline (its own, or others to try)")
    al.add_argument("run", help="a run directory (its metrics.jsonl and eval/)")
    al.add_argument("--config", help="a config whose monitor.alarms to check (default: the run's own)")
    add_set(al, "set an alarm key, e.g. --set 'monitor.alarms=[{name: e, detector: exploit, threshold: 1.5}]'")
    al.set_defaults(fn=alarms, user_errors=FILES)


def alarms(args: argparse.Namespace) -> int:
    """The alarms as the run would have fired them live (:func:`scope.alarms.replay`), at the same steps."""
    from ..alarms import markdown, replay
    from ..configfile import load_config

    cfg = load_config(args.config or os.path.join(args.run, "config.yaml"), args.set)
    if not cfg.monitor.alarms:
        raise UsageError("no alarms to check: the config has no monitor.alarms (give --config or --set)")
    print(markdown(replay(args.run, cfg.monitor.alarms)), end="")
    return 0
