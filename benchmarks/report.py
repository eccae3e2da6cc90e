"""Benchmarks report their headline figures here as well as printing them: with ``SCOPE_BENCH_JSON`` set
(``benchmarks/all.py`` sets it), each call appends one JSON line ``{"bench": name, figure: value, ...}``.
``rss_mb`` is the resident set the memory benchmarks sample."""
from __future__ import annotations

import json
import os
import threading
import time


def report(bench: str, **figures: float) -> None:
    path = os.environ.get("SCOPE_BENCH_JSON")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"bench": bench, **{k: float(v) for k, v in figures.items()}}) + "\n")


def rss_mb() -> float:
    """This process's resident set now, in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def track_peak() -> list[float]:
    """Start a daemon thread that keeps this process's peak resident set (MB) in the returned list's only
    item, sampled every 3 ms; set the item to restart the peak from there."""
    peak = [rss_mb()]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.003)

    threading.Thread(target=sample, daemon=True).start()
    return peak
