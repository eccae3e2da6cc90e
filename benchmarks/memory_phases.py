"""Where a training step's peak memory comes from: the rollout, or one role's learner update.

Runs ``benchmarks/population.py``'s config for one mode in this process, samples the resident set every
3 ms, and for each step prints the peak of each phase (rollout, update:<adapter>) and, for each update,
the resident set once its freed heap was handed back (the update's own start) and its transient (peak
minus that start). A diagnostic, not a goal: ``population.py`` holds the goals.

    python benchmarks/memory_phases.py single --steps 3
    python benchmarks/memory_phases.py population --steps 3
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

from population import config  # benchmarks/population.py (a script's own directory is on sys.path)
from report import rss_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["single", "cotrain", "population"])
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()

    import torch

    from scope import learner as L
    from scope.config import parse_config
    from scope.train import train

    torch.set_num_threads(2)
    phase, peaks, starts = ["rollout"], {}, {}  # phase: what the sampler charges the resident set to

    def sample() -> None:
        while True:
            k = phase[0]
            peaks[k] = max(peaks.get(k, 0.0), rss_mb())
            time.sleep(0.003)

    threading.Thread(target=sample, daemon=True).start()
    update, trim = L.Learner.update, L.release_free_memory

    def traced_update(self, traces, advantages):
        phase[0] = f"update:{self.adapter}"
        try:
            return update(self, traces, advantages)
        finally:
            phase[0] = "rollout"

    def traced_trim() -> None:
        trim()
        starts.setdefault(phase[0], rss_mb())  # the first trim of an update: where the update starts from

    L.Learner.update, L.release_free_memory = traced_update, traced_trim

    def end(step) -> None:
        parts = [f"rollout peak {peaks.get('rollout', 0):.0f}"]
        for k in sorted(p for p in peaks if p.startswith("update:")):
            s = starts.get(k, 0.0)
            parts.append(f"{k} start {s:.0f} peak {peaks[k]:.0f} transient {peaks[k] - s:.0f}")
        print(f"{a.mode} step {step}: resident {rss_mb():.0f} MB | " + " | ".join(parts), flush=True)
        peaks.clear()
        starts.clear()

    with tempfile.TemporaryDirectory() as d:
        train(parse_config(config(a.mode, os.path.join(d, "run"), a.steps)), on_step_end=end, log=lambda s: None)


if __name__ == "__main__":
    sys.exit(main())
