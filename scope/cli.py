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
    train(cfg, resume=bool(args.resume), log=lambda s: print(s, flush=True))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .config import dump_config

    cfg = load_config(args.config, args.set)
    print(dump_config(cfg))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .models.local import load_backend
    from .models.server import make_server

    b = load_backend(args.model, seed=args.seed)
    if args.adapter:
        from peft import PeftModel

        b.model = PeftModel.from_pretrained(b.model, args.adapter, adapter_name="served")
        b.versions["served"] = 0
    srv = make_server(b, host=args.host, port=args.port, model_name=args.name or args.model,
                      fail_rate=args.fail_rate, seed=args.seed, max_batch=args.max_batch)
    if args.adapter:
        orig = b.generate
        b.generate = lambda prompts, sp, adapter=None, sessions=None: orig(prompts, sp, "served", sessions)
    host, port = srv.server_address[:2]
    print(f"serving {args.model} at http://{host}:{port}/v1 (chat completions)", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
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
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--name", help="the model name the endpoint reports")
    v.add_argument("--max-batch", type=int, default=32)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--fail-rate", type=float, default=0.0,
                   help="answer this share of requests with 503 (fault-injection testing)")
    v.set_defaults(fn=cmd_serve)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
