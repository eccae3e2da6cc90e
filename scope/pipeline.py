"""Asynchronous rollouts: the dialogues of the next K steps are generated while this step trains.

``rollout.max_staleness: K``. With K = 0 the loop is synchronous: each step's jobs are drawn, played to their
end, then trained on (``Feed.take`` calls the rollout exactly as the synchronous loop always has). With K >= 1:

    step t:  submit the jobs of steps t .. t+K not yet submitted      (drawn in step order; weights as they are)
             wait for step t's episodes                                (async/wait_seconds: the learner idle)
             drop (or keep) the episodes more than K versions behind  (async/staleness_*, dropped, finished)
             update every learner; publish the new weights             (rollout.stale: finish)

A version is a learner's update count (``backend.versions``), recorded on every generated turn. A batch
submitted before update t-1 is trained at update t+K-1: at most K versions behind, so no episode passes the
bound in normal running, and the check at training time is a guard (a worker restarted on older weights, say).
``rollout.stale`` says what the guard does and how dialogues under way meet newer weights:

- ``drop``: a batch plays on the weights it was submitted with; an episode past the bound is left out.
- ``finish`` (partial rollout): every new version is published after each update and the generator takes it up
  between two turns, so a dialogue under way finishes on the newer weights; an episode past the bound is kept.

Where generation runs (``rollout_workers.make_rollout``): Ray workers (``rollout.workers`` > 0), the vLLM
engine fed from a thread of this process (:class:`EngineRollout`), or a thread with its own copy of the models
(``rollout_workers.ThreadRollout``). Weights travel adapter-only and by version, read in the learner's thread
between two updates, so a sync never blocks a generation under way.

Checkpoints. Nothing is submitted past a checkpoint's step: the pipeline is empty when a checkpoint is taken,
so the checkpoint holds the task sampler, partners and weights exactly as a synchronous run's, and a run
resumed after a crash discards what was in flight (it was never in a checkpoint) and draws the same tasks
again. The step after a checkpoint is therefore generated synchronously (staleness 0).

Evaluation (the panel, the probe, the diagnostics) runs in the learner's thread on the learner's current
weights; the probe and the diagnostics score the step's episodes, whose versions the metrics name.
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, Callable, Protocol, runtime_checkable

from .contracts import Rollout
from .rollout import Job, RolloutStats, run_rollouts
from .types import Episode


@runtime_checkable
class AsyncRollout(Rollout, Protocol):
    """A rollout whose generation runs off the learner's thread."""

    def submit(self, jobs: list[Job], **kw: Any) -> Any:
        """Hand ``jobs`` out with the weights as they are now; return at once (a handle for ``result``)."""
        ...

    def result(self, pending: Any) -> tuple[list[Episode], RolloutStats]:
        """Wait for a submitted batch: its episodes, in the jobs' order, and its statistics."""
        ...

    def publish(self) -> None:
        """Make the weights as they are now available to the batches under way (taken up between turns)."""
        ...


def on_engine(backends: dict) -> bool:
    """Whether any of the run's models samples on a vLLM engine."""
    from .models.vllm_backend import EngineBackend

    return any(isinstance(b, EngineBackend) for b in backends.values())


class EngineRollout:
    """The vLLM engine fed from one thread of this process: ``run_rollouts`` on the run's own backends, whose
    engines serve the adapter versions published (``EngineBackend.publish``) by the learner's thread."""

    def __init__(self, cfg, backends: dict):
        from .models.vllm_backend import EngineBackend

        self.engines = [b for b in backends.values() if isinstance(b, EngineBackend)]
        for e in self.engines:
            e.hold()
        self.finish = cfg.rollout.stale == "finish"
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="scope-engine-rollout")
        self.stats: dict[str, float] = {}

    def submit(self, jobs: list[Job], **kw) -> Future:
        views = [(e, e.publish()) for e in self.engines]
        kw = {k: v for k, v in kw.items() if k not in ("progress", "finish")}
        return self.pool.submit(self._run, jobs, [] if self.finish else views, kw)

    @staticmethod
    def _run(jobs: list[Job], views: list, kw: dict) -> tuple[list[Episode], RolloutStats]:
        with ExitStack() as stack:
            for e, versions in views:
                stack.enter_context(e.viewing(versions))
            return run_rollouts(jobs, **kw)

    def publish(self) -> None:
        for e in self.engines:
            e.publish()

    def result(self, pending: Future) -> tuple[list[Episode], RolloutStats]:
        return pending.result()

    def __call__(self, jobs: list[Job], **kw) -> tuple[list[Episode], RolloutStats]:
        return self.result(self.submit(jobs, **kw))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class Feed:
    """Each step's jobs, drawn in step order (``draw(step)``), played by ``rollout`` up to ``max_staleness`` steps
    ahead of the learner. ``kw``: the rollout's keyword arguments (``progress`` is given per step)."""

    def __init__(self, rollout: Rollout, max_staleness: int, stale: str, draw: Callable[[int], list[Job]],
                 kw: dict[str, Any], progress: Callable[[int], Any] | None = None):
        if max_staleness > 0 and not isinstance(rollout, AsyncRollout):
            raise TypeError(f"rollout.max_staleness {max_staleness}: {type(rollout).__name__} generates in the "
                            f"learner's thread only")
        self.rollout, self.k, self.stale, self.draw = rollout, max_staleness, stale, draw
        self.kw, self.progress = kw, progress
        self.pending: deque[tuple[int, list[Job], Any]] = deque()

    def take(self, step: int, horizon: int) -> tuple[list[Job], list[Episode], RolloutStats, dict[str, float]]:
        """Step ``step``'s jobs and episodes (waiting for them), having submitted every step up to
        min(step + K, ``horizon``) not yet submitted (``horizon``: the next checkpoint's step)."""
        if self.k == 0:
            jobs = self.draw(step)
            episodes, stats = self.rollout(jobs, **self.kw, progress=self.progress and self.progress(step))
            return jobs, episodes, stats, {}
        assert isinstance(self.rollout, AsyncRollout)
        nxt = self.pending[-1][0] + 1 if self.pending else step
        if nxt != step and (not self.pending or self.pending[0][0] != step):
            raise RuntimeError(f"asynchronous rollouts: step {step} was not submitted (next is {nxt})")
        while nxt <= min(step + self.k, horizon):
            jobs = self.draw(nxt)
            kw = dict(self.kw, finish=self.stale == "finish")
            self.pending.append((nxt, jobs, self.rollout.submit(jobs, **kw)))
            nxt += 1
        s, jobs, handle = self.pending.popleft()
        t0 = time.perf_counter()
        episodes, stats = self.rollout.result(handle)
        return jobs, episodes, stats, {"async/wait_seconds": time.perf_counter() - t0,
                                       "async/in_flight": float(len(self.pending))}

    def published(self) -> None:
        """The learners have updated: with ``stale: finish`` the batches under way take the new weights up."""
        if self.k and self.stale == "finish" and self.pending:
            assert isinstance(self.rollout, AsyncRollout)
            self.rollout.publish()

    def close(self) -> int:
        """Stop (the batches under way are waited for and discarded); how many were discarded."""
        n = len(self.pending)
        for _, _, handle in self.pending:
            try:
                self.rollout.result(handle)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - discarded anyway
                pass
        self.pending.clear()
        return n


def model_id(ref) -> str:
    """The id a trained model's turns carry (``Completion.model_id``)."""
    return f"{ref.backend.name}:{ref.adapter or 'base'}"


def staleness(episodes: list[Episode], owners: dict[str, tuple[Any, list[str]]], k: int,
              stale: str) -> tuple[dict[str, list[Episode]], dict[str, float]]:
    """For each learner (``owners``: owner -> (its trained model's ref, the roles it trains)): the episodes it
    trains on, and the step's staleness metrics. An episode's staleness for a learner is the learner's version
    now minus the oldest version among the turns of its model in the traces it trains; past ``k`` it is dropped
    (``stale: drop``) or kept (``finish``), counted either way. ``async/finished_episodes``: episodes whose
    trained turns span more than one version (a dialogue finished on newer weights)."""
    out: dict[str, list[Episode]] = {}
    m: dict[str, float] = {}
    for owner, (ref, roles) in owners.items():
        mid, now = model_id(ref), ref.version
        keep, ages, dropped, over, mixed = [], [], 0, 0, 0
        for ep in episodes:
            versions = {v for role in roles if role in ep.traces
                        for (i, v) in ep.traces[role].models if i == mid}
            if ep.failed or not versions:
                keep.append(ep)
                continue
            age = now - min(versions)
            ages.append(age)
            mixed += len(versions) > 1
            if age > k:
                over += 1
                if stale == "drop":
                    dropped += 1
                    continue
            keep.append(ep)
        out[owner] = keep
        prefix = "" if owner == "agent" else f"{owner}/"
        m.update({f"{prefix}async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
                  f"{prefix}async/staleness_max": float(max(ages, default=0)),
                  f"{prefix}async/dropped_episodes": float(dropped),
                  f"{prefix}async/over_bound_episodes": float(over),
                  f"{prefix}async/finished_episodes": float(mixed)})
    return out, m
