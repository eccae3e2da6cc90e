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
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
