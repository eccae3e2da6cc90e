"""What stops a run, and how loudly: the checks before a run starts (nothing is written when one fails),
and the end of a run that can no longer learn anything; plus the per-step endpoint counters."""
from __future__ import annotations

import contextlib
import os

from .config import Config
from .envs.base import get_env
from .envs.tasks import load_tasks
from .rollout import Job
from .types import Episode, Task


def endpoint_metrics(jobs: list[Job], seen: dict[str, dict[str, int]]) -> dict[str, float]:
    """This step's requests, retries, timeouts and failures per API endpoint (``endpoint/<model>/...``)."""
    out: dict[str, float] = {}
    from .models.openai_backend import OpenAIRef

    refs = {id(b.ref): b.ref for j in jobs for b in j.bindings.values() if isinstance(b.ref, OpenAIRef)}
    for ref in refs.values():
        now, before = ref.stats.snapshot(), seen.get(ref.id, {})
        out.update({f"endpoint/{ref.id}/{k}": float(v - before.get(k, 0)) for k, v in now.items()})
        seen[ref.id] = now
    return out


class StartupError(RuntimeError):
    """The run cannot start (a missing file, a bad split, a model that does not exist); nothing was written."""


@contextlib.contextmanager
def starting(what: str):
    """Errors while the run is being set up become one StartupError naming ``what`` failed."""
    from .config import ConfigError

    try:
        yield
    except StartupError:
        raise
    except (ConfigError, ValueError, KeyError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise StartupError(f"{what}: {msg}") from e


def check_start(cfg: Config, resume: bool) -> list[Task]:
    """What can be checked before any model is loaded: the run directory, the environment's tasks of both
    splits (data files, personas, split names) and the evaluation panel. Returns the training tasks."""
    from .trackers import check_trackers

    with starting("run.report_to"):
        check_trackers(cfg.run.report_to)
    from .partners.rewards import reward_of

    for role, rc in cfg.roles().items():
        if rc.reward != "env":
            with starting(f"{role}.reward"):
                reward_of(rc.reward)
    metrics = os.path.join(cfg.run.dir, "metrics.jsonl")
    if not resume and os.path.exists(metrics):
        raise StartupError(f"{cfg.run.dir} already holds a run; use --resume {cfg.run.dir} or another run.dir")
    env_cls = get_env(cfg.env.name)
    tasks: dict[str, list[Task]] = {}
    for split in dict.fromkeys((cfg.env.train_split, cfg.env.eval_split)):
        with starting(f"env {cfg.env.name!r}, split {split!r}"):
            tasks[split] = load_tasks(cfg.env, split)
            if not tasks[split]:
                raise ValueError("no tasks")
    if cfg.eval.panel:
        from .eval import load_panel

        with starting(f"eval.panel {cfg.eval.panel}"):
            panel = load_panel(cfg.eval.panel)
            missing = sorted({p.model for p in panel.partners} - set(cfg.models) - set(panel.models))
            if missing:
                raise ValueError(f"partners use models {missing}, defined neither in the config nor the panel")
            for p in panel.partners:  # names and types of each partner's own environment options
                if p.env_options:
                    env_cls.check_options(p.env_options, where=f"partner {p.spec_id()!r}: env_options")
            if cfg.eval.select_on == "seen" and not any(p.seen for p in panel.partners):
                raise ValueError("eval.select_on is seen, but the panel marks no partner seen: mark the training "
                                 "simulators `seen: true`, or set eval.select_on: all (the unseen partners then "
                                 "choose the best checkpoint and are no longer held out)")
            if panel.split:
                load_tasks(cfg.env, panel.split)
    return tasks[cfg.env.train_split]


class RunFailed(RuntimeError):
    """The run can no longer do anything useful (e.g. every rollout fails)."""


def stop_if_dead(episodes: list[Episode], dead_steps: int, limit: int, step: int) -> int:
    """The count of consecutive steps whose every episode failed, this one included; at ``limit`` the run
    stops with an error naming the most common cause."""
    dead = dead_steps + 1 if episodes and all(e.failed for e in episodes) else 0
    if dead >= limit:
        raise RunFailed(f"every episode of the last {dead} steps failed (train.max_failed_steps); the run stops "
                        f"at step {step} without training on it. Most common cause: {common_error(episodes)}")
    return dead


def common_error(episodes: list[Episode]) -> str:
    counts: dict[str, int] = {}
    for e in episodes:
        if e.failed:
            counts[e.error or "unknown"] = counts.get(e.error or "unknown", 0) + 1
    if not counts:
        return "none"
    err, n = max(counts.items(), key=lambda kv: kv[1])
    return f"{err} ({n} of {len(episodes)} episodes)"
