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


def _grid(tmp_path, name, records=None, log=lambda s: None):
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
            seeds=1, overrides=tiny, log=log, records=records)
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


def test_a_grid_packed_into_records_is_restored_and_not_run_again(tmp_path):
    import tarfile

    from scope.lab.records import pack, unpack

    records = str(tmp_path / "records")
    a = _grid(tmp_path, "a", records=records)
    names = sorted(os.listdir(records))
    assert names == ["base-seed0.tar.gz", "ensemble-seed0.tar.gz", "single-seed0.tar.gz"]
    with tarfile.open(os.path.join(records, "single-seed0.tar.gz")) as tar:
        members = tar.getnames()
    assert "single/seed0/metrics.jsonl" in members and "single/seed0/config.yaml" in members
    assert any(m.startswith("single/seed0/eval/") for m in members)
    assert os.path.isdir(os.path.join(a, "single", "seed0", "checkpoints"))
    assert not any("checkpoints" in m or m.endswith(".safetensors") for m in members)  # records leave weights out
    assert pack(a, records) == []  # reproducible bytes: packing again rewrites nothing
    for fn in names:
        os.remove(os.path.join(records, fn))
    assert pack(a, records, only=("single", 0)) == [os.path.join(records, "single-seed0.tar.gz")]  # that run only
    assert len(pack(a, records)) == 2  # the other two

    lines: list[str] = []
    b = _grid(tmp_path, "b", records=records, log=lines.append)
    assert sum("restored" in x for x in lines) == 3
    assert sum("done already" in x for x in lines) == 3 and not any("..." in x for x in lines)  # none trained
    assert open(os.path.join(a, "table.md")).read() == open(os.path.join(b, "table.md")).read()
    assert unpack(records, b) == []  # a run directory already there is not overwritten

    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(bad / "single-seed0.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("single/seed0/../../escape.txt")
        tar.addfile(info, __import__("io").BytesIO(b""))
    try:
        unpack(str(bad), str(tmp_path / "c"))
    except ValueError as e:
        assert "outside single/seed0" in str(e)
    else:
        raise AssertionError("a record reaching outside its run directory was unpacked")
    assert not os.path.exists(tmp_path / "escape.txt")
