"""A whole training run on the tiny model: metrics, readable rollouts, checkpoints and resume."""
import json
import os

import pytest

from scope.config import parse_config
from scope.run import read_metrics
from scope.guards import StartupError
from scope.train import train


def tiny_cfg(run_dir, steps=4, save_every=2):
    return parse_config({
        "run": {"dir": str(run_dir), "save_every": save_every, "progress": False},
        "models": {"policy": {"path": "tiny-random"}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 12},
        "partner": {"model": "policy", "max_new_tokens": 12},
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 3, "end_on_truncation": False},
        "train": {"steps": steps, "lr": 1e-3}})


REQUIRED = ["reward_mean", "reward_std", "policy_entropy", "zero_variance_frac", "all_success_frac",
            "all_failure_frac", "turns_mean", "tokens_generated", "rollout_seconds", "train_seconds",
            "tokens_per_second", "failed_episodes"]


def test_run_writes_metrics_rollouts_tensorboard_and_checkpoints(tmp_path):
    run = tmp_path / "run"
    lines = []
    train(tiny_cfg(run, steps=2, save_every=1), log=lines.append)
    ms = read_metrics(str(run))
    assert [m["step"] for m in ms] == [1, 2]
    for k in REQUIRED:
        assert k in ms[0], k
    assert any(ln.startswith("step 2/2 reward") and ln.endswith("| eta 0s") for ln in lines)
    assert any(ln.startswith("step 1/2 reward") and " | eta " in ln for ln in lines)
    recs = [json.loads(x) for x in open(run / "rollouts" / "step_000001.jsonl")]
    assert len(recs) == 6
    r = recs[0]
    assert r["messages"][0]["role"] == "agent" and "rewards" in r and r["tokens"]["agent"]["generated"] > 0
    assert r["models"]["partner"] and r["meta"]["persona"]
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(run / "tb"))
    ck = sorted(os.listdir(run / "checkpoints"))
    assert ck == ["step_000001", "step_000002"]
    assert os.path.exists(run / "checkpoints" / "step_000002" / "agent" / "agent" / "adapter_model.safetensors")
    assert os.path.exists(run / "checkpoints" / "step_000002" / "state.pt")
    with pytest.raises(StartupError, match="already holds a run"):
        train(tiny_cfg(run, steps=2), log=lambda s: None)


class Crash(Exception):
    pass


def test_resume_after_a_crash_continues_the_same_metrics_file(tmp_path):
    run = tmp_path / "run"
    straight = tmp_path / "straight"
    train(tiny_cfg(straight), log=lambda s: None)

    def crash_after(step):
        if step == 3:
            raise Crash()

    with pytest.raises(Crash):
        train(tiny_cfg(run), on_step_end=crash_after, log=lambda s: None)
    assert [m["step"] for m in read_metrics(str(run))] == [1, 2, 3]
    train(tiny_cfg(run), resume=True, log=lambda s: None)
    ms = read_metrics(str(run))
    assert [m["step"] for m in ms] == [1, 2, 3, 4]
    # resuming restores weights, optimizer, sampler and RNG: the run matches one that never stopped
    ref = read_metrics(str(straight))
    for a, b in zip(ms, ref):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["tokens_generated"] == b["tokens_generated"]


def test_a_resume_before_the_first_checkpoint_starts_the_metrics_over(tmp_path):
    """A run cut off before its first checkpoint resumes from step 0 and makes its step-0 evaluation again:
    the file keeps one line per step (a resumed lab run had two step-0 lines)."""
    from scope.run import MetricsLogger, RunDir

    cfg = tiny_cfg(tmp_path / "run")
    run = RunDir(str(tmp_path / "run"), cfg)
    with open(run.file("metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps({"step": s, "reward_mean": 0.5}) + "\n" for s in (0, 1, 2)))
    MetricsLogger(RunDir(run.path, cfg, resume=True), cfg, start_step=1).close()
    assert [m["step"] for m in read_metrics(run.path)] == [0, 1]
    MetricsLogger(RunDir(run.path, cfg, resume=True), cfg, start_step=0).close()
    assert read_metrics(run.path) == []


def test_cli_resume(tmp_path):
    import subprocess
    import sys

    import yaml

    run = tmp_path / "run"
    cfg = tiny_cfg(run, steps=1, save_every=1)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    r = subprocess.run([sys.executable, "-m", "scope.cli", "train", "--config", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "scope.cli", "train", "--resume", str(run), "--set", "train.steps=2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "resumed from step 1" in r.stdout
    assert [m["step"] for m in read_metrics(str(run))] == [1, 2]


def test_a_run_raises_no_library_deprecation_warnings(tmp_path):
    """A normal run shows scope's own lines, not transformers' or PEFT's FutureWarnings that scope causes."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(tiny_cfg(tmp_path / "w", steps=1, save_every=1), log=lambda s: None)
    future = [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))
              and "scope" not in str(w.filename)]
    assert not [m for m in future if "past_key_values" in m or "is_gradient_checkpointing" in m], future


def test_what_a_crash_mid_save_leaves_is_never_resumed_from(tmp_path):
    """A kill during a checkpoint write leaves step_N.tmp (with a partial state.pt): it is not chosen on
    resume and is removed; a kill between the two renames of a replaced directory gets the old one back;
    a metrics line torn by the kill is dropped; the rest of the run is as if it had never stopped."""
    import shutil

    run = tmp_path / "run"
    straight = tmp_path / "straight"
    train(tiny_cfg(straight), log=lambda s: None)
    with pytest.raises(Crash):
        train(tiny_cfg(run), on_step_end=lambda s: (_ for _ in ()).throw(Crash()) if s == 2 else None,
              log=lambda s: None)
    ck = run / "checkpoints"
    shutil.copytree(ck / "step_000002", ck / "step_000004.tmp")  # a later save that never finished ...
    (ck / "step_000004.tmp" / "state.pt").write_bytes(b"\x80\x02partial")  # ... cut off mid-write
    os.replace(ck / "step_000002", ck / "step_000002.old")  # and a re-save of step 2 cut off between renames
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward_me')  # the line being written when the kill came
    assert [m["step"] for m in read_metrics(str(run))] == [1, 2]  # a torn last line is left out
    train(tiny_cfg(run), resume=True, log=lambda s: None)
    assert sorted(os.listdir(ck)) == ["step_000002", "step_000004"]
    ms, ref = read_metrics(str(run)), read_metrics(str(straight))
    assert [m["step"] for m in ms] == [1, 2, 3, 4]
    for a, b in zip(ms, ref):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "rew\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):  # damage inside the file is not hidden
        read_metrics(str(run))


def test_a_checkpoint_state_that_holds_arbitrary_objects_is_refused(tmp_path):
    """Checkpoint state is loaded with weights_only: tensors and plain data, no arbitrary unpickling."""
    import pickle

    import torch

    run = tmp_path / "run"
    train(tiny_cfg(run, steps=1, save_every=1), log=lambda s: None)
    state = run / "checkpoints" / "step_000001" / "state.pt"
    torch.save({"step": 1, "payload": pickle.loads(pickle.dumps(Crash("x")))}, state)
    with pytest.raises(pickle.UnpicklingError):
        train(tiny_cfg(run, steps=2), resume=True, log=lambda s: None)


def test_a_run_whose_every_episode_fails_stops_loudly(tmp_path):
    """A dead endpoint: every rollout fails; after train.max_failed_steps such steps the run stops with an
    error naming the cause (and the CLI exits non-zero without a traceback); retries are in the metrics."""
    import subprocess
    import sys

    import yaml

    from scope.guards import RunFailed

    data = tiny_cfg(tmp_path / "dead", steps=6, save_every=1).model_dump(mode="json")
    data["models"]["api"] = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model_name": "m",
                             "api_key_env": None, "max_retries": 1, "backoff": 0.0, "timeout": 2}
    data["partner"]["model"] = "api"
    data["train"]["max_failed_steps"] = 2
    with pytest.raises(RunFailed, match="every episode of the last 2 steps failed.*Connection"):
        train(parse_config(data), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "dead"))
    assert [m["step"] for m in ms] == [1]  # the second dead step is not written, and nothing after it
    assert ms[0]["failed_episodes"] == 6 and ms[0]["endpoint/api/retries"] == 6
    assert ms[0]["endpoint/api/failures"] == 6 and ms[0]["endpoint/api/requests"] == 12
    data["run"]["dir"] = str(tmp_path / "dead_cli")
    (tmp_path / "dead.yaml").write_text(yaml.safe_dump(data))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "scope.cli", "train", "--config", str(tmp_path / "dead.yaml")],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: every episode of the last 2 steps failed")


@pytest.mark.parametrize("change,needle", [
    ({"models": {"policy": {"path": "/no/such/model"}}}, "models: model '/no/such/model' is neither"),
    ({"env": {"train_split": "dev"}}, "env 'p4g', split 'dev'"),
    ({"env": {"options": {"personas": "/no/personas.json"}}}, "/no/personas.json"),
    ({"eval": {"panel": "/no/panel.yaml"}}, "eval.panel /no/panel.yaml: panel file /no/panel.yaml not found"),
    ({"eval": {"panel": {"partners": [{"id": "x", "model": "ghost"}]}}}, "models ['ghost'], defined neither"),
    ({"env": {"options": {"colour": "red"}}}, "env.options: colour: not an option of 'p4g'"),
    ({"train": {"eps_high": 1.5}}, "train.eps_high"),
])
def test_bad_setup_is_one_line_and_leaves_no_run_dir(tmp_path, capsys, change, needle):
    import yaml

    from scope.cli import main

    data = tiny_cfg(tmp_path / "run", steps=1).model_dump(mode="json")
    for k, v in change.items():
        if k == "eval" and isinstance(v.get("panel"), dict):  # a panel file with a partner of no model
            (tmp_path / "p.yaml").write_text(yaml.safe_dump(v["panel"]))
            v = {"panel": str(tmp_path / "p.yaml")}
        for kk, vv in v.items():
            if isinstance(vv, dict):
                data[k][kk].update(vv)
            else:
                data[k][kk] = vv
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    code = main(["train", "--config", str(tmp_path / "c.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert not (tmp_path / "run").exists()


def test_the_time_left_of_a_progress_line():
    from scope.run import eta

    assert [eta(100, 2, 3), eta(100, 1, 100), eta(10, 1, 0), eta(0, 0, 5), eta(30, 3, 4)] == \
        ["eta 2min", "eta 2.8h", "eta 0s", "eta ?", "eta 40s"]
