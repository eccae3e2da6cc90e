"""The generic grid (``scope grid``, scope/grid/) on a tiny recipe fixture (tests/grid_fixture/): the plan, an arm
that evaluates the policy as built, hooks, records, resume, the same table twice, and grid.yaml's errors."""
import json
import os
import shutil
import tarfile

import pytest

from scope.config import ConfigError
from scope.grid.runner import run_grid
from scope.grid.spec import read_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "grid_fixture")
VOLATILE = ("seconds", "tokens_per_second", "time", "rss", "memory")


def configs(tmp_path, **grid_over) -> str:
    """A copy of the fixture's configs whose panel is the copy's (and grid.yaml's keys replaced by ``grid_over``)."""
    import yaml

    d = tmp_path / "configs"
    if not d.exists():
        shutil.copytree(FIXTURE, d, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        common = yaml.safe_load((d / "common.yaml").read_text())
        common["eval"]["panel"] = str(d / "panel.yaml")
        (d / "common.yaml").write_text(yaml.safe_dump(common))
    if grid_over:
        g = yaml.safe_load((d / "grid.yaml").read_text())
        g.update(grid_over)
        (d / "grid.yaml").write_text(yaml.safe_dump(g, sort_keys=False))
    return str(d)


def grid(tmp_path, name, log=lambda s: None, **kw):
    out = str(tmp_path / name)
    res = run_grid(configs(tmp_path), out, log=log, **kw)
    return out, res


def metrics(out, arm):
    with open(os.path.join(out, arm, "seed0", "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(x).items() if not any(w in k for w in VOLATILE)} for x in f]


def test_the_plan_is_the_grids_arms_by_seed_or_its_runs():
    spec = read_spec(FIXTURE)
    assert spec.plan() == [("base", 0), ("single", 0), ("rotation", 0)]
    assert spec.plan(seeds=2)[3:] == [("base", 1), ("single", 1), ("rotation", 1)]
    assert spec.plan(arms=("rotation",), seeds=2) == [("rotation", 0), ("rotation", 1)]
    ordered = spec.model_copy(update={"runs": ["single@1", "base", "single"]})
    assert ordered.plan(seeds=2) == [("single", 1), ("base", 0), ("single", 0)]
    assert ordered.plan(seeds=1) == [("base", 0), ("single", 0)]  # a run of a seed beyond --seeds is left out
    with pytest.raises(ValueError, match="unknown arms"):
        spec.plan(arms=("nope",))


def test_grid_yaml_errors_name_what_is_wrong(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    with pytest.raises(ConfigError, match="grid.yaml not found"):
        read_spec(str(d))
    (d / "grid.yaml").write_text("arms: {a: {}}\nruns: [b]\n")
    with pytest.raises(ConfigError, match="no such arm"):
        read_spec(str(d))
    (d / "grid.yaml").write_text("arms: {a: {}}\n")
    with pytest.raises(ConfigError, match="a.yaml is not there"):
        read_spec(str(d))
    (d / "a.yaml").write_text("run: {dir: x}\n")
    (d / "grid.yaml").write_text("arms: {a: {stepz: 0}}\n")
    with pytest.raises(ConfigError, match="stepz"):
        read_spec(str(d))
    (d / "grid.yaml").write_text("arms: {a: {}}\nhooks: {sections: ['no.such.module:f']}\n")
    from scope.grid.spec import hook

    with pytest.raises(ConfigError, match="no.such.module"):
        hook(read_spec(str(d)).hooks.sections[0])


def test_a_grid_runs_its_arms_hooks_and_the_untrained_arm(tmp_path):
    lines: list[str] = []
    out, res = grid(tmp_path, "a", log=lines.append)
    assert list(res["arms"]) == ["base", "single", "rotation"] and res["labels"]["base"] == "As built"
    base = metrics(out, "base")
    assert [m["step"] for m in base] == [0] and "reward_mean" not in base[0]  # evaluated once, never trained
    single = metrics(out, "single")
    assert [m["step"] for m in single] == [0, 1, 2]
    # the untrained arm's evaluation is every trained arm's own step 0
    assert {k: v for k, v in base[0].items() if k.startswith("eval/")} == \
        {k: v for k, v in single[0].items() if k.startswith("eval/")}
    assert res["panel"] == {"members": 3}  # the before hook's result, kept under its key
    assert json.load(open(os.path.join(out, "panel.json"))) == {"members": 3}
    table = open(os.path.join(out, "table.md")).read()
    assert "| As built |" in table and "| Rotation |" in table and "(unseen)" in table
    assert table.rstrip().endswith(".") and "Final unseen: As built " in table  # the section, below the table
    assert res["finals"]["single"] == res["arms"]["single"]["unseen"]
    # one family only (the tiny model's): each trained arm is warned of, and the unseen simulator is marked
    [warning] = [x for x in lines if "WARNING" in x]
    assert "One partner, Rotation:" in warning and "model family (tiny-random)" in warning
    assert "hot†‡ (unseen)" in table and "‡: every unseen simulator is of a training simulator's model family" in table
    assert "another family" not in table  # no column for a family the panel does not have
    for name in ("curves.png", "results.json", "dialogues.md"):
        assert os.path.getsize(os.path.join(out, name)) > 0


def test_a_grid_run_twice_gives_the_same_table(tmp_path):
    """The same seed and config give the same table on the same machine, and a torch thread count set elsewhere
    in the process does not reach a config that pins run.threads."""
    import torch

    a, _ = grid(tmp_path, "a")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 would: the config's run.threads=2 wins
    try:
        b, _ = grid(tmp_path, "b")
    finally:
        torch.set_num_threads(before)
    ta, tb = (open(os.path.join(d, "table.md")).read() for d in (a, b))
    assert "[" in ta and "torch threads: 2" in ta
    assert ta == tb
    for arm in ("single", "rotation"):
        assert metrics(a, arm) == metrics(b, arm), arm


def test_a_grid_packed_into_records_is_restored_and_not_run_again(tmp_path):
    from scope.grid.records import pack, unpack

    records = str(tmp_path / "records")
    a, _ = grid(tmp_path, "a", records=records)
    names = sorted(os.listdir(records))
    assert names == ["base-seed0.tar.gz", "rotation-seed0.tar.gz", "single-seed0.tar.gz"]
    with tarfile.open(os.path.join(records, "single-seed0.tar.gz")) as tar:
        members = tar.getnames()
    assert "single/seed0/metrics.jsonl" in members and "single/seed0/config.yaml" in members
    assert os.path.isdir(os.path.join(a, "single", "seed0", "checkpoints"))
    assert not any("checkpoints" in m or m.endswith(".safetensors") for m in members)  # records leave weights out
    spec = read_spec(configs(tmp_path))
    assert pack(a, records, spec) == []  # reproducible bytes: packing again rewrites nothing
    for fn in names:
        os.remove(os.path.join(records, fn))
    assert pack(a, records, spec, only=("single", 0)) == [os.path.join(records, "single-seed0.tar.gz")]
    assert len(pack(a, records, spec)) == 2
    lines: list[str] = []
    b, _ = grid(tmp_path, "b", records=records, log=lines.append)
    assert sum("restored" in x for x in lines) == 3
    assert sum("done already" in x for x in lines) == 3 and not any(x.endswith("...") for x in lines)  # none ran
    assert open(os.path.join(a, "table.md")).read() == open(os.path.join(b, "table.md")).read()
    assert unpack(records, b) == []  # a run directory already there is not overwritten
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(bad / "single-seed0.tar.gz", "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("single/seed0/../../escape.txt"), __import__("io").BytesIO(b""))
    with pytest.raises(ValueError, match="outside single/seed0"):
        unpack(str(bad), str(tmp_path / "c"))
    assert not os.path.exists(tmp_path / "escape.txt")


def test_an_untrained_record_from_before_the_steps_key_counts_as_finished(tmp_path):
    """A record of the untrained arm whose saved config still says the trained config's steps (as P4G-pitch's
    Base records do) is finished by the grid's own count (the arm's ``steps: 0``)."""
    from scope.grid.records import finished_runs

    a, _ = grid(tmp_path, "a", arms=("base",))
    cfg = os.path.join(a, "base", "seed0", "config.yaml")
    text = open(cfg).read()
    assert "steps: 0" in text
    open(cfg, "w").write(text.replace("steps: 0", "steps: 40"))
    assert finished_runs(a) == []
    assert finished_runs(a, read_spec(configs(tmp_path))) == [("base", 0, os.path.join(a, "base", "seed0"))]


def test_a_run_cut_off_before_its_first_checkpoint_starts_over_and_a_later_one_resumes(tmp_path):
    out = str(tmp_path / "a")
    run_grid(configs(tmp_path), out, arms=("single",), overrides=["run.save_every=1000"])
    done = metrics(out, "single")
    shutil.rmtree(os.path.join(out, "single", "seed0", "checkpoints"))
    with open(os.path.join(out, "single", "seed0", "metrics.jsonl"), "w") as f:  # cut off at step 1
        f.write(json.dumps({"step": 1}) + "\n")
    lines: list[str] = []
    run_grid(configs(tmp_path), out, arms=("single",), overrides=["run.save_every=1000"], log=lines.append)
    assert metrics(out, "single") == done and any("step 2/2" in x for x in lines)  # made again, the same


def test_every_end_of_training_figure_is_the_stated_window(tmp_path):
    """The grid's table and `scope plot`'s scores take a training figure at the end as the mean of the last
    TRAIN_WINDOW (4) steps and at the start as the first 4, never the last step alone."""
    from scope.grid.summary import run_summary
    from scope.plot import scores_table
    from scope.stats import TRAIN_WINDOW

    assert TRAIN_WINDOW == 4
    rows = [{"step": s, "reward_mean": float(s), "policy_entropy": 10.0 - s, "zero_variance_frac": s / 10}
            for s in range(1, 11)]
    rows += [{"step": s, "collapse/partner_share": s / 10} for s in (2, 4, 6, 8, 10)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_summary(str(tmp_path))
    assert r["train_reward"] == pytest.approx(8.5) and r["train_reward_start"] == pytest.approx(2.5)
    assert r["entropy_end"] == pytest.approx(1.5) and r["zero_variance_end"] == pytest.approx(0.85)
    assert r["partner_share_start"] == pytest.approx(0.2) and r["partner_share_end"] == pytest.approx(1.0)
    assert "| 8.500 |" in scores_table({"run": rows})  # not the last step's 10.000


def test_steps_zero_needs_a_panel(tmp_path):
    from helpers import tiny_run

    with pytest.raises(ConfigError, match="train.steps: 0"):
        tiny_run(tmp_path, steps=0)


def test_records_keep_the_final_adapters_in_half_precision_when_the_grid_asks(tmp_path):
    """``records: {adapters: fp16}``: each trained run's record carries its last checkpoint's LoRA adapters in half
    precision (and that step); a run restored from it packs to the same bytes; a model loads the kept adapter."""
    from safetensors.torch import load_file

    from scope.grid.records import pack, unpack

    d = configs(tmp_path, records={"adapters": "fp16"})
    records = str(tmp_path / "records")
    a = str(tmp_path / "a")
    run_grid(d, a, log=lambda s: None, records=records)
    with tarfile.open(os.path.join(records, "single-seed0.tar.gz")) as tar:
        names = tar.getnames()
        kept = [n for n in names if n.startswith("single/seed0/final_adapters/")]
        assert tar.extractfile("single/seed0/final_adapters/step.txt").read() == b"2\n"
    weights = [n for n in kept if n.endswith("adapter_model.safetensors")]
    assert weights and all(n.endswith(".safetensors") or n.endswith(".json") or n.endswith("step.txt") for n in kept)
    assert not any("checkpoints" in n for n in names)
    b = str(tmp_path / "b")
    unpack(records, b)
    rel = weights[0][len("single/seed0/"):]
    half = load_file(os.path.join(b, "single", "seed0", rel))
    full = load_file(os.path.join(a, "single", "seed0", "checkpoints", "step_000002",
                                  rel[len("final_adapters/"):]))
    assert set(half) == set(full) and half
    for k in full:
        assert half[k].dtype == __import__("torch").float16 and (half[k].float() - full[k]).abs().max() < 1e-3
    again = str(tmp_path / "again")
    spec = read_spec(d)
    pack(b, again, spec)
    for fn in os.listdir(records):  # a restored run (no checkpoints) packs to the same bytes
        assert open(os.path.join(again, fn), "rb").read() == open(os.path.join(records, fn), "rb").read(), fn
    from scope.config import ModelConfig
    from scope.models.loading import frozen_refs

    kept_dir = os.path.join(b, "single", "seed0", os.path.dirname(rel))
    ref = frozen_refs({"kept": ModelConfig(path="tiny-random", adapter=kept_dir)}, {})["kept"]
    loaded = {n: p for n, p in ref.backend.model.named_parameters() if f".{ref.adapter}." in n}
    assert len(loaded) == len(half)  # every kept tensor is in the model, as the run's policy ended
    for k, v in half.items():
        got = loaded[k.replace(".weight", f".{ref.adapter}.weight")]
        assert (got.detach().float() - v.float()).abs().max() == 0, k
