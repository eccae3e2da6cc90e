"""run.report_to: the run's config, every step's scalars and its curves reach Weights & Biases (offline) and
MLflow (a local file store), a resumed run continues the same tracker run, and a tracker that is not
installed stops the run before anything is written. Nothing leaves the machine."""
import json
import os
import sys

import pytest

from scope.config import ConfigError
from helpers import tiny_run
from scope.guards import StartupError
from scope.run import read_metrics
from scope.train import train


def cfg_with(run_dir, report_to, steps=2):
    return tiny_run(run_dir, steps, run={"save_rollouts": False, "report_to": report_to})


def test_wandb_offline_and_mlflow_get_config_metrics_and_plots_and_a_resume_continues_them(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    train(cfg_with(run, ["wandb", "mlflow"], steps=1), log=lambda s: None)
    train(cfg_with(run, ["wandb", "mlflow"], steps=2), resume=True, log=lambda s: None)
    logged = read_metrics(str(run))
    assert [m["step"] for m in logged] == [1, 2]

    # mlflow: one run, both sittings' steps, the config as params, the curves as artifacts
    client = mlflow.tracking.MlflowClient(tracking_uri="file://" + str(run / "mlruns"))
    run_id = open(run / "mlflow_id").read().strip()
    hist = client.get_metric_history(run_id, "reward_mean")
    assert sorted(m.step for m in hist) == [1, 2]
    assert [m.value for m in sorted(hist, key=lambda m: m.step)] == pytest.approx([m["reward_mean"] for m in logged])
    got = client.get_run(run_id)
    assert got.data.params["train.lr"] == "0.001" and got.data.params["env.name"] == "p4g"
    assert "train_reward.png" in {os.path.basename(a.path) for a in client.list_artifacts(run_id, "plots")}
    assert len(client.search_runs([got.info.experiment_id])) == 1

    # wandb (offline): one run directory per sitting, both under the run id kept in RUN_DIR/wandb_id, each
    # holding its steps' scalars, the config and the curves (two sittings that start within the same second get
    # the same directory name, the second with a "-1" after it)
    ident = open(run / "wandb_id").read().strip()
    sittings = sorted(d for d in os.listdir(run / "wandb") if d.startswith("offline-run-"))
    assert len(sittings) == 2 and all(d.endswith(ident) or d.endswith(ident + "-1") for d in sittings)
    logs = [open(os.path.join(run / "wandb", d, f"run-{ident}.wandb"), "rb").read() for d in sittings]
    # (a step's value is in its history record and again in the run's summary)
    assert [set(_wandb_values(b, "reward_mean")) for b in logs] == [{m["reward_mean"]} for m in logged]
    assert all(b"train_reward" in b and b"kl_coef" in b for b in logs)  # a curve, a config key
    assert os.listdir(os.path.join(run / "wandb", sittings[1], "files", "media", "images", "plots"))


def _wandb_values(blob: bytes, key: str) -> list[float]:
    """The values an offline run's log holds for history key ``key`` (a HistoryItem is the key, field 2, and
    its JSON value, field 16, both short strings here)."""
    tag = b"\x12" + bytes([len(key)]) + key.encode() + b"\x82\x01"
    out, i = [], blob.find(tag)
    while i >= 0:
        n = blob[i + len(tag)]
        out.append(float(json.loads(blob[i + len(tag) + 1:i + len(tag) + 1 + n])))
        i = blob.find(tag, i + 1)
    return out


def test_a_tracker_that_is_not_installed_stops_the_run_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    run = tmp_path / "run"
    with pytest.raises(StartupError, match=r"run.report_to: wandb is not installed \(pip install wandb\)"):
        train(cfg_with(run, ["wandb"]), log=lambda s: None)
    assert not run.exists()
    with pytest.raises(ConfigError, match="unknown tracker 'comet'"):
        cfg_with(run, ["comet"])


def test_no_tracker_writes_the_jsonl_only(tmp_path):
    run = tmp_path / "run"
    train(cfg_with(run, [], steps=1), log=lambda s: None)
    assert len(read_metrics(str(run))) == 1 and not (run / "tb").exists()
