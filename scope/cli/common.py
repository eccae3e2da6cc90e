"""What every command shares: the error a user can fix, and the repeated ``--set`` option."""
from __future__ import annotations

import argparse


FILES = (FileNotFoundError, ValueError)
"""A command's ``user_errors`` where a missing file or a value out of range is the user's to fix: one line."""


class UsageError(Exception):
    """A command given what it cannot use (a missing option, an unknown name): one ``error:`` line, exit 2."""


def add_set(p: argparse.ArgumentParser, text: str = "override a config value, e.g. --set train.steps=5 "
                                                    "(repeatable)") -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=text)


def log(s: str) -> None:
    print(s, flush=True)
