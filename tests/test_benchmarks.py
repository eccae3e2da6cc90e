"""The benchmark scripts' own pieces that can run at a tiny size (the figures themselves are never tested)."""
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def test_population_benchmark_switches_pool_members(tiny, monkeypatch):
    """benchmarks/population.py's pool-switch figure runs against the current pool API (a stale call once kept
    `make bench` from reporting the population's figures)."""
    monkeypatch.syspath_prepend(BENCH)
    sys.modules.pop("population", None)
    import population

    assert population.switch_time(n=10, backend=tiny) > 0
