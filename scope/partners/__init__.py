"""Where each role's replies come from: sources of bindings (sources.py), Verbalized Sampling (vs.py),
the population pool (pool.py) and partner rewards (rewards.py)."""
