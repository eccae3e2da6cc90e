"""Benchmarks report their headline figures here as well as printing them: with ``SCOPE_BENCH_JSON`` set
(``benchmarks/all.py`` sets it), each call appends one JSON line ``{"bench": name, figure: value, ...}``.
``rss_mb`` is the resident set the memory benchmarks sample."""
from __future__ import annotations

import json
import os


def report(bench: str, **figures: float) -> None:
    path = os.environ.get("SCOPE_BENCH_JSON")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"bench": bench, **{k: float(v) for k, v in figures.items()}}) + "\n")


def rss_mb() -> float:
    """This process's resident set now, in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
