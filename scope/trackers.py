"""Where a run's metrics go besides RUN_DIR/metrics.jsonl (always written): ``run.report_to``, as TRL's
``report_to``. Each tracker gets the config at the start, every step's scalars, and the run's plots at the end.

- ``tensorboard``: RUN_DIR/tb (event files);
- ``wandb``: a Weights & Biases run under RUN_DIR/wandb, with the run's id kept in RUN_DIR/wandb_id so that
  a resumed run continues it (``WANDB_MODE=offline`` keeps everything on the machine);
- ``mlflow``: an MLflow run in ``MLFLOW_TRACKING_URI`` (default: a file store in RUN_DIR/mlruns), its id
  kept in RUN_DIR/mlflow_id.

A tracker that is configured but not installed is an error at start-up, before anything is written
(:func:`check_trackers`). Others register theirs in :data:`TRACKERS`.
"""
from __future__ import annotations

import importlib
import json
import os
import uuid
from typing import Any, Callable, Protocol

from .registry import Registry


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self, plots: list[str]) -> None:
        """The end of the run (or of this sitting of it): ``plots`` are PNG files of the run's curves."""
        ...


TrackerFactory = Callable[[str, dict[str, Any], int], Tracker]
"""``(run directory, the run's config as a dict, the step it starts after) -> Tracker``."""

TRACKERS: Registry[TrackerFactory] = Registry("tracker", group="scope.trackers")
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow-skinny")}
"""Each built-in tracker's module and the pip package that provides it."""


def check_trackers(names: list[str]) -> None:
    """Every configured tracker is known and importable; a ``ValueError`` naming what to install if not."""
    for name in names:
        if name == "jsonl":
            continue
        if name not in TRACKERS:
            raise ValueError(f"unknown tracker {name!r}; known: jsonl, {', '.join(TRACKERS.names())}")
        if name in PACKAGES:
            module, package = PACKAGES[name]
            try:
                importlib.import_module(module)
            except ImportError:
                raise ValueError(f"{name} is not installed (pip install {package})") from None


def open_trackers(names: list[str], run_dir: str, config: dict[str, Any], start_step: int) -> list[Tracker]:
    return [TRACKERS.get(n)(run_dir, config, start_step) for n in dict.fromkeys(names) if n != "jsonl"]


def _kept_id(run_dir: str, name: str, new: Callable[[], str]) -> str:
    """The id this run's tracker run has, kept in RUN_DIR/<name> so that a resumed run continues it."""
    path = os.path.join(run_dir, name)
    if os.path.exists(path):
        return open(path).read().strip()
    ident = new()
    with open(path, "w") as f:
        f.write(ident)
    return ident


@TRACKERS.register("tensorboard")
class TensorBoardTracker:
    def __init__(self, run_dir: str, config: dict[str, Any], start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(os.path.join(run_dir, "tb"), purge_step=start_step + 1 if start_step else None)
        if not start_step:
            self.w.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.w.add_scalar(k, v, step)
        self.w.flush()

    def close(self, plots: list[str]) -> None:
        self.w.close()


@TRACKERS.register("wandb")
class WandbTracker:
    def __init__(self, run_dir: str, config: dict[str, Any], start_step: int):
        import wandb

        ident = _kept_id(run_dir, "wandb_id", lambda: uuid.uuid4().hex[:12])
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "scope"), id=ident, resume="allow",
                              name=os.path.basename(os.path.normpath(run_dir)), dir=run_dir, config=config)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self, plots: list[str]) -> None:
        if plots:
            self.run.log({f"plots/{os.path.basename(p)[:-4]}": self.wandb.Image(p) for p in plots})
        self.run.finish()


@TRACKERS.register("mlflow")
class MlflowTracker:
    def __init__(self, run_dir: str, config: dict[str, Any], start_step: int):
        import mlflow

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):  # a file store of the run's own (no server, no database)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri("file://" + os.path.abspath(os.path.join(run_dir, "mlruns")))
        path = os.path.join(run_dir, "mlflow_id")
        resumed = os.path.exists(path)
        run_id = open(path).read().strip() if resumed else None
        self.run = mlflow.start_run(run_id=run_id, run_name=os.path.basename(os.path.normpath(run_dir)))
        if not resumed:
            with open(path, "w") as f:
                f.write(self.run.info.run_id)
            flat = _flatten(config)
            mlflow.log_params({k: str(v)[:500] for k, v in flat.items()})

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.mlflow.log_metrics({_mlflow_key(k): v for k, v in scalars.items()}, step=step)

    def close(self, plots: list[str]) -> None:
        for p in plots:
            self.mlflow.log_artifact(p, artifact_path="plots")
        self.mlflow.end_run()


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _mlflow_key(k: str) -> str:
    """MLflow's metric names allow letters, digits and ``_-./ :``; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-./ :" else "_" for c in k)
