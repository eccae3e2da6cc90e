"""Run directories: config, metrics (JSONL + TensorBoard), readable rollouts and checkpoints."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from typing import Any, cast

import numpy as np
import torch

from .config import Config, dump_config
from .types import Episode

STEP_DIR = re.compile(r"step_\d{6}$")


def fsync_tree(path: str) -> None:
    """Flush every file under ``path`` and the directories themselves to disk (before a rename publishes them)."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(tmp: str, final: str) -> None:
    """Make the finished directory ``tmp`` the new ``final`` so that a crash at any moment leaves either the
    old or the new one in place: the old one is renamed aside (``final.old``) before the new one is renamed in,
    and removed after; :func:`recover_dir` puts it back if a crash came in between."""
    fsync_tree(tmp)
    old = final + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(os.path.dirname(os.path.abspath(final)))
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(final: str) -> None:
    """Undo what a crash inside :func:`publish_dir` or before it left behind: the old directory comes back
    if the new one never arrived; an unpublished ``final.tmp`` is removed."""
    old = final + ".old"
    if os.path.exists(old):
        if os.path.exists(final):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, final)
    shutil.rmtree(final + ".tmp", ignore_errors=True)


def write_atomic(path: str, text: str) -> None:
    """Replace a file's content in one rename (written and flushed to a temporary file first)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _json_lines(path: str) -> list[dict[str, Any]]:
    """The JSON lines of ``path``; a last line torn by a crash mid-write is left out, a bad line elsewhere
    is an error that names it."""
    with open(path) as f:
        lines = [ln for ln in f.read().split("\n")]
    out = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:
            if any(x.strip() for x in lines[i + 1:]):
                raise ValueError(f"{path}: line {i + 1} is not JSON (the file is damaged)") from None
    return out


class RunDir:
    def __init__(self, path: str, cfg: Config, resume: bool = False):
        self.path = path
        os.makedirs(path, exist_ok=True)
        cfg_path = os.path.join(path, "config.yaml")
        if not resume and os.path.exists(os.path.join(path, "metrics.jsonl")):
            raise FileExistsError(f"{path} already holds a run; use --resume {path} or another run.dir")
        if not resume:
            with open(cfg_path, "w") as f:
                f.write(dump_config(cfg))

    def file(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    def write_rollouts(self, step: int, records: list[dict[str, Any]]) -> None:
        d = self.file("rollouts")
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".step_{step:06d}.jsonl.tmp")
        with open(tmp, "w") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        os.replace(tmp, os.path.join(d, f"step_{step:06d}.jsonl"))


def rollout_records(episodes: list[Episode]) -> list[dict[str, Any]]:
    return [e.summary() for e in episodes]


class MetricsLogger:
    """Appends one JSON line per step to metrics.jsonl and hands the step's scalars to each tracker of
    ``run.report_to`` (:mod:`scope.trackers`: TensorBoard, Weights & Biases, MLflow).

    On resume from step S, lines of steps after S (written after the checkpoint) are dropped first,
    so the file continues as if the run had never stopped; from step 0 (no checkpoint yet) every line is, the
    step-0 evaluation's too, which the run makes again.
    """

    def __init__(self, run: RunDir, cfg: Config, start_step: int = 0):
        from .trackers import open_trackers

        self.run = run
        self.path = run.file("metrics.jsonl")
        if os.path.exists(self.path):  # drop what came after the checkpoint (and a line torn by the crash)
            keep = [m for m in _json_lines(self.path) if m.get("step", 0) <= start_step] if start_step > 0 else []
            write_atomic(self.path, "".join(json.dumps(m) + "\n" for m in keep))
        self.report_to = list(cfg.run.report_to)
        self.trackers = open_trackers(self.report_to, run.path, cfg.model_dump(mode="json"), start_step)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) else v)
                 for k, v in metrics.items()}
        clean["step"] = step
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
            f.flush()
            os.fsync(f.fileno())
        scalars = {k: v for k, v in clean.items() if k != "step" and isinstance(v, float)}
        for t in self.trackers:
            t.log(step, scalars)

    @property
    def wants_plots(self) -> bool:
        """Whether a tracker keeps images (wandb, mlflow): then the run's curves are drawn for :meth:`close`."""
        return bool(set(self.report_to) & {"wandb", "mlflow"})

    def close(self, plots: list[str] | None = None) -> None:
        """The end of the run (of this sitting): each tracker closes, given the run's curves (PNG files)."""
        for t in self.trackers:
            t.close(list(plots or []))


def read_metrics(path: str) -> list[dict[str, Any]]:
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    return _json_lines(path)


def save_weights(backend, adapter: str | None, out: str) -> None:
    """One adapter (PEFT format, under ``out/<adapter>``) or the full weights with their tokenizer."""
    if adapter is not None:
        backend.model.save_pretrained(out, selected_adapters=[adapter])
    else:
        backend.model.save_pretrained(out)
        backend.tokenizer.save_pretrained(out)


class Checkpointer:
    """``checkpoints/step_NNNNNN/``: adapters or weights, optimizer states, RNG states, step, config.

    Written to a temporary directory, flushed to disk and renamed into place, so a crash at any moment
    leaves every published checkpoint whole; a half-written ``step_N.tmp`` is never chosen and is removed
    when the run starts again. Only the newest ``keep_checkpoints`` are kept.
    """

    def __init__(self, run: RunDir, cfg: Config):
        self.root = run.file("checkpoints")
        self.cfg = cfg
        os.makedirs(self.root, exist_ok=True)
        for d in os.listdir(self.root):  # what a crash mid-save left behind
            if STEP_DIR.match(d.split(".")[0]) and d != d.split(".")[0]:
                recover_dir(os.path.join(self.root, d.split(".")[0]))

    def list(self) -> list[str]:
        return sorted(d for d in os.listdir(self.root) if STEP_DIR.fullmatch(d) and
                      os.path.exists(os.path.join(self.root, d, "state.pt")))

    def save(self, step: int, backends, learners, sampler, env_rng: random.Random, sources=None,
             before_publish=None) -> str:
        """``before_publish(tmp)``: writes what other processes add to the checkpoint (a distributed run's
        sharded training state) before the directory is published; by default each learner's own
        ``save_dcp`` writes its training state into ``dist_<role>/``."""
        final = os.path.join(self.root, f"step_{step:06d}")
        tmp = final + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        from .partners.pool import PoolSource

        for role, learner in learners.items():
            save_weights(learner.backend, learner.adapter, os.path.join(tmp, role))
        state = {
            "step": step,
            "learners": {r: learner.state_dict() for r, learner in learners.items()},
            "sampler": sampler.state_dict(),
            "env_rng": env_rng.getstate(),
            "python_rng": random.getstate(),
            "numpy_rng": _numpy_state(),
            "torch_rng": torch.get_rng_state(),
            "generators": {k: b.generator.get_state() for k, b in backends.items()},
            "sources": {r: s.state_dict() for r, s in (sources or {}).items()},
        }
        for r, src in (sources or {}).items():
            if isinstance(src, PoolSource):  # its member adapters, in order
                src.save(os.path.join(tmp, f"pool_{r}"))
        torch.save(state, os.path.join(tmp, "state.pt"))
        with open(os.path.join(tmp, "config.yaml"), "w") as f:
            f.write(dump_config(self.cfg))
        if before_publish is not None:
            before_publish(tmp)
        else:
            for role, learner in learners.items():
                learner.save_dcp(os.path.join(tmp, f"dist_{role}"))
        publish_dir(tmp, final)
        for old in self.list()[:-self.cfg.run.keep_checkpoints]:
            shutil.rmtree(os.path.join(self.root, old), ignore_errors=True)
        return final

    last_loaded: str | None = None
    """The checkpoint directory ``load_latest`` read."""

    def load_latest(self, backends, learners, sampler, env_rng: random.Random, sources=None) -> int:
        done = self.list()
        if not done:
            return 0
        path = os.path.join(self.root, done[-1])
        self.last_loaded = path
        state = torch.load(os.path.join(path, "state.pt"), weights_only=True)  # tensors and plain data only
        for role, learner in learners.items():
            src = os.path.join(path, role)
            if learner.adapter is not None:
                from peft import set_peft_model_state_dict
                from peft.utils import load_peft_weights

                sub = os.path.join(src, learner.adapter) if os.path.isdir(os.path.join(src, learner.adapter)) \
                    else src
                set_peft_model_state_dict(learner.backend.model, load_peft_weights(sub),
                                          adapter_name=learner.adapter)
            else:
                from transformers import AutoModelForCausalLM

                loaded = AutoModelForCausalLM.from_pretrained(src)
                learner.backend.model.load_state_dict(loaded.state_dict())
            learner.load_state_dict(state["learners"][role])
            d = os.path.join(path, f"dist_{role}")
            if os.path.isdir(d):  # the training state, written at any world size
                learner.load_dcp(d)
        sampler.load_state_dict(state["sampler"])
        env_rng.setstate(state["env_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(_numpy_state_back(state["numpy_rng"]))
        torch.set_rng_state(state["torch_rng"])
        for k, b in backends.items():
            if k in state["generators"]:
                b.generator.set_state(state["generators"][k])
        from .partners.pool import PoolSource

        for r, src in (sources or {}).items():
            if r not in state.get("sources", {}):
                continue
            if isinstance(src, PoolSource):
                src.load(os.path.join(path, f"pool_{r}"), state["sources"][r])
            else:
                src.load_state_dict(state["sources"][r])
        return int(state["step"])




def _numpy_state() -> tuple:
    """numpy's global RNG state in plain types (a checkpoint is loaded with ``weights_only``)."""
    state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())  # legacy=True: a tuple
    kind, keys, pos, has_gauss, cached = state
    return kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)


def _numpy_state_back(st) -> tuple:
    kind, keys, pos, has_gauss, cached = st
    return kind, np.asarray(keys.numpy() if isinstance(keys, torch.Tensor) else keys, dtype=np.uint32), pos, \
        has_gauss, cached


def eta(elapsed: float, done: int, left: int) -> str:
    """A progress line's estimate of the time left: ``left`` more of what took ``elapsed`` seconds for ``done``."""
    if done <= 0 or left <= 0:
        return "eta 0s" if left <= 0 else "eta ?"
    sec = elapsed / done * left
    return f"eta {sec / 3600:.1f}h" if sec >= 5400 else (f"eta {sec / 60:.0f}min" if sec >= 90 else f"eta {sec:.0f}s")
