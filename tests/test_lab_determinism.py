"""The same seed and config give the same table on the same machine: a small grid (RL (Single) and
Ensemble of configs/p4g_mini on tiny models, two steps) run twice into two directories writes the same
table.md and the same per-run metrics, and a torch thread count set elsewhere in the process does not
reach a config that pins run.threads."""
import json
import os

import yaml

from conftest import shared_path
from scope.lab.runner import run_lab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOLATILE = ("seconds", "tokens_per_second", "time", "rss", "memory")


def _grid(tmp_path, name):
    p4g = shared_path("data", "p4g")
    with open(os.path.join(ROOT, "configs", "p4g_mini", "panel.yaml")) as f:
        panel = yaml.safe_load(f)
    panel["episodes"] = 2
    panel["partners"] = [p for p in panel["partners"] if p["id"] != "fitted-to-people"]
    panel["models"] = {}
    (tmp_path / "panel.yaml").write_text(yaml.safe_dump(panel))
    tiny = ["models.policy.path=tiny-random", "train.steps=2", "eval.every=1", f"eval.panel={tmp_path / 'panel.yaml'}",
            f"env.options.data_dir={p4g}", "env.options.max_turns=1", "rollout.n_tasks=2", "rollout.group_size=2",
            "agent.max_new_tokens=4", "partner.max_new_tokens=4", "diagnostics.probe_every=0",
            "diagnostics.decompose_every=1", "diagnostics.decompose_tasks=2", "diagnostics.decompose_samples=2",
            "diagnostics.decompose_resamples=2", "run.threads=2"]
    out = str(tmp_path / name)
    run_lab(out, configs=os.path.join(ROOT, "configs", "p4g_mini"), paradigms=("base", "single", "ensemble"),
            seeds=1, overrides=tiny, log=lambda s: None)
    return out


def _metrics(out, p):
    with open(os.path.join(out, p, "seed0", "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(x).items() if not any(w in k for w in VOLATILE)} for x in f]


def test_a_grid_run_twice_gives_the_same_table(tmp_path):
    import torch

    a = _grid(tmp_path, "a")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 would: the config's run.threads=2 wins
    try:
        b = _grid(tmp_path, "b")
    finally:
        torch.set_num_threads(before)
    ta, tb = (open(os.path.join(d, "table.md")).read() for d in (a, b))
    assert "[" in ta and "torch threads: 2" in ta  # intervals, and the thread count the numbers depend on
    assert ta == tb
    for p in ("single", "ensemble"):
        assert _metrics(a, p) == _metrics(b, p), p
