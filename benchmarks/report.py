"""Benchmarks report their headline figures here as well as printing them: with ``SCOPE_BENCH_JSON`` set
(``benchmarks/all.py`` sets it), each call appends one JSON line ``{"bench": name, figure: value, ...}``."""
from __future__ import annotations

import json
import os


def report(bench: str, **figures: float) -> None:
    path = os.environ.get("SCOPE_BENCH_JSON")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"bench": bench, **{k: float(v) for k, v in figures.items()}}) + "\n")
