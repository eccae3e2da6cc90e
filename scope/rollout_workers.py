"""Ray rollout workers: the same Job -> Episode contract as ``run_rollouts``, run in N actors.

``rollout.workers: N`` (N > 0) makes ``make_rollout`` return a ``RayRollout``. Each worker is a Ray actor
that builds its own copy of the run's models from the config (``setup.build_models``) and runs
``run_rollouts`` on its share of a step's jobs. The driver keeps everything that decides *who* plays
(the sources: rotation, personas, the pool's draws) and the learners; a job travels to a worker with
each role's model reference replaced by its name (backend key, adapter), and the episode comes back.

Weights reach the workers the way they reach an engine: adapter-only and by version. Before a step the
driver compares each adapter's version (the learner's update count; a pool member's copy) with the
version each worker holds, and sends the adapters that moved (each read once a step and put in Ray's
store once, whichever workers need it); adapters that left the driver's model (an evicted pool member) are
deleted on the workers.
Fully fine-tuned weights are sent whole.

A worker that dies, or a call that raises, turns that worker's episodes into failed episodes (the step
goes on) and the worker is started afresh for the next step.

Ray binds to 127.0.0.1 when it starts a local instance here (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
``_node_ip_address``); ``ray.address`` joins a cluster started with ``ray start`` (see the README for a
safe multi-machine setup).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

# Ray reads this when it is imported: without it a local instance listens on the machine's own address
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from .contracts import Rollout
from .models.backend import ModelRef
from .rollout import Job, RolloutStats, run_rollouts


@dataclass(frozen=True)
class RefName:
    """A model reference by name: rebuilt from the receiver's own backends."""

    kind: str            # "local" | "openai"
    key: str             # backend key (local) or models entry (openai)
    adapter: str | None
    id: str
    trainable: bool = False


class LocalRollout:
    """The rollout engine in this process: a :class:`~scope.contracts.Rollout`."""

    def __init__(self) -> None:
        self.stats: dict[str, float] = {}

    def __call__(self, jobs: list[Job], **kw) -> tuple[list, RolloutStats]:
        return run_rollouts(jobs, **kw)

    def close(self) -> None:
        pass


def make_rollout(cfg, backends: dict) -> Rollout:
    """The engine in this process, or Ray workers when ``rollout.workers`` > 0; with asynchronous rollouts
    (``rollout.max_staleness`` > 0) and no workers, a thread of this process with its own copy of the models, or
    (models on a vLLM engine) the engine fed from a thread (``scope.pipeline``)."""
    if cfg.rollout.workers > 0:
        return RayRollout(cfg, backends)
    if cfg.rollout.max_staleness > 0:
        from .pipeline import EngineRollout, on_engine

        return EngineRollout(cfg, backends) if on_engine(backends) else ThreadRollout(cfg, backends)
    return LocalRollout()


def _ray_init(address: str | None):
    import ray

    if ray.is_initialized():
        return ray
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
    return ray


PLAY_WAIT = 600.0
"""Seconds a worker waits for the batch handed out before the one it was given; then it plays it anyway."""


@dataclass
class Pending:
    """A step's jobs handed to the workers: each worker's share and its call (None: a worker with no jobs)."""

    jobs: list[Job]
    parts: list[list[Job]]
    calls: list[Any]
    t0: float


class WorkerRollout:
    """Generation in copies of the run's models that receive the driver's weights by version: Ray actors
    (:class:`RayRollout`) or a thread of this process (:class:`ThreadRollout`). ``submit`` hands a step's jobs
    out with the weights as they are now and returns at once; ``result`` waits for them (``__call__``: both)."""

    def __init__(self, cfg, backends: dict, n: int):
        self.cfg, self.backends, self.n = cfg, backends, n
        self.sent: list[dict[tuple[str, str | None], int]] = [{} for _ in range(n)]
        self.stats = {"weight_syncs": 0, "sync_seconds": 0.0, "worker_failures": 0, "restarts": 0}
        self.key_of = {id(b): k for k, b in backends.items()}
        # the models the copies hold (the driver's as they were built from the config): an evaluation panel's
        # members, loaded into the driver's table later, are not the generators' to hold nor to be sent
        self.keys = list(backends)
        self.plays = [0] * n  # batches handed to each worker: it plays them in this order
        self.seq = 0  # every hand-out of weights is numbered: a worker applies them in this order

    # -- the transport (a subclass's) --
    def _launch(self, i: int, weights: tuple, jobs: list[Job], kw: dict) -> Any:
        raise NotImplementedError

    def _collect(self, call: Any) -> tuple[list, RolloutStats]:
        raise NotImplementedError

    def _offer(self, i: int, weights: tuple) -> None:
        raise NotImplementedError

    def _put(self, payload):
        return payload

    def _restart(self, i: int) -> None:
        raise NotImplementedError

    # -- naming references --
    def _name(self, ref) -> RefName:
        if isinstance(ref, ModelRef):
            key = self.key_of.get(id(ref.backend))
            if key is None:
                raise ValueError(f"model reference {ref.id!r} is not on one of this run's backends")
            return RefName("local", key, ref.adapter, ref.id, bool(getattr(ref, "trainable", False)))
        return RefName("openai", ref.id, None, ref.id)

    def _weights(self) -> tuple[dict[tuple[str, str | None], int], dict[str, list[str]]]:
        """(the version of every adapter, and of fully fine-tuned weights once updated; adapters per backend)."""
        versions, live = {}, {}
        for key in self.keys:
            b = self.backends[key]
            local = getattr(b, "local", b)
            live[key] = local.adapter_names()
            for a in live[key]:
                versions[(key, a)] = local.versions.get(a, 0)
            mc = self.cfg.models.get(key.split("#")[0])  # (a shared LoRA base's key names no single entry)
            if mc is not None and mc.finetune == "full" and "#" not in key and local.versions.get(None, 0):
                versions[(key, None)] = local.versions[None]
        return versions, live

    def _payload(self, key: str, adapter: str | None, version: int):
        local = getattr(self.backends[key], "local", self.backends[key])
        if adapter is None:
            return version, {k: t.detach().cpu().clone() for k, t in local.model.state_dict().items()}, None
        return version, _adapter_state(local, adapter), local.lora_settings(adapter)

    def _moved(self, i: int, versions: dict, stored: dict) -> dict:
        """The weights worker ``i`` lacks (each read, and put in the transport's store, once per call)."""
        moved = [k for k, v in versions.items() if self.sent[i].get(k) != v]
        for k in moved:
            if k not in stored:
                stored[k] = self._put(self._payload(k[0], k[1], versions[k]))
        self.stats["weight_syncs"] += len(moved)
        for k in moved:
            self.sent[i][k] = versions[k]
        return {k: stored[k] for k in moved}

    def submit(self, jobs: list[Job], **kw) -> Pending:
        if kw.get("judge") is not None:
            kw["judge"] = _swap_binding(kw["judge"], self._name)
        parts = [jobs[k::self.n] for k in range(self.n)] if len(jobs) >= self.n else [jobs]
        kw = {k: v for k, v in kw.items() if k != "progress"}
        calls: list[Any] = []
        t0 = time.perf_counter()
        versions, live = self._weights()
        stored: dict[tuple[str, str | None], Any] = {}
        for i, part in enumerate(parts):
            if not part:
                calls.append(None)
                continue
            self.seq += 1
            self.plays[i] += 1
            send = (self.seq, self._moved(i, versions, stored), live)
            calls.append(self._launch(i, send, [_swap_job(j, self._name) for j in part], dict(kw, play=self.plays[i])))
        self.stats["sync_seconds"] += time.perf_counter() - t0
        return Pending(jobs, parts, calls, t0)

    def publish(self) -> None:
        """Offer every worker the weights that moved since it was last sent any: it takes them up between two
        turns of the dialogues it is playing (``rollout.stale: finish``)."""
        t0 = time.perf_counter()
        versions, live = self._weights()
        stored: dict[tuple[str, str | None], Any] = {}
        for i in range(self.n):
            moved = self._moved(i, versions, stored)
            if moved:
                self.seq += 1
                self._offer(i, (self.seq, moved, live))
        self.stats["sync_seconds"] += time.perf_counter() - t0

    def result(self, p: Pending) -> tuple[list, RolloutStats]:
        total = RolloutStats()
        for i, (part, call) in enumerate(zip(p.parts, p.calls)):
            if call is None:
                continue
            try:
                eps, st = self._collect(call)
            except Exception as e:  # noqa: BLE001 - a dead worker fails its episodes, not the step
                self.stats["worker_failures"] += 1
                for j in part:
                    j.episode.status = "failed"
                    j.episode.error = f"rollout worker {i} failed: {type(e).__name__}: {str(e)[:300]}"
                self._restart(i)
                continue
            for j, ep in zip(part, eps):
                j.episode = ep
            total.tokens_generated += st.tokens_generated
            total.calls += st.calls
            total.rounds = max(total.rounds, st.rounds)
            total.seconds = max(total.seconds, st.seconds)
            for m, n in st.per_model.items():
                total.per_model[m] = total.per_model.get(m, 0) + n
        if not total.seconds:
            total.seconds = time.perf_counter() - p.t0
        return [j.episode for j in p.jobs], total

    def __call__(self, jobs: list[Job], **kw) -> tuple[list, RolloutStats]:
        p = self.submit(jobs, **kw)
        eps, total = self.result(p)
        total.seconds = time.perf_counter() - p.t0
        return eps, total


class RayRollout(WorkerRollout):
    def __init__(self, cfg, backends: dict):
        super().__init__(cfg, backends, cfg.rollout.workers)
        self.ray = _ray_init(cfg.ray.address)
        self.workers: list[Any] = [None] * self.n
        for i in range(self.n):
            self._start(i)

    def _start(self, i: int) -> None:
        ray = self.ray
        # calls at once: ``offer`` reaches a worker while its ``run`` plays, and with asynchronous rollouts up to
        # K more batches' calls wait their turn (each holds a thread of the actor while it waits)
        Actor = ray.remote(num_cpus=self.cfg.ray.cpus_per_worker, max_restarts=0,
                           max_concurrency=2 + self.cfg.rollout.max_staleness)(RolloutWorker)
        self.workers[i] = Actor.remote(self.cfg.model_dump(), i)
        self.sent[i] = {}
        self.plays[i] = 0

    def _put(self, payload):
        return self.ray.put(payload)

    def _launch(self, i, weights, jobs, kw):
        return self.workers[i].run.remote(weights, jobs, kw)

    def _offer(self, i, weights):
        self.workers[i].offer.remote(weights)

    def _collect(self, call):
        return self.ray.get(call)

    def _restart(self, i: int) -> None:
        try:
            self.ray.kill(self.workers[i])
        except Exception:  # noqa: BLE001
            pass
        self.stats["restarts"] += 1
        self._start(i)

    def close(self) -> None:
        for w in self.workers:
            try:
                self.ray.kill(w)
            except Exception:  # noqa: BLE001
                pass


class ThreadRollout(WorkerRollout):
    """One worker in a thread of this process, with its own copy of the run's models (the asynchronous loop's
    in-process generator: the learner's weights change under training, the copy's only when sent). Its torch
    ops use ``threads`` threads (default: half the cores)."""

    def __init__(self, cfg, backends: dict, threads: int | None = None):
        from concurrent.futures import ThreadPoolExecutor

        super().__init__(cfg, backends, 1)
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="scope-rollout", initializer=self._init_thread)
        self.worker = self.pool.submit(RolloutWorker, cfg.model_dump(), 0).result()

    def _init_thread(self) -> None:
        import torch

        torch.set_num_threads(self.threads)

    def _launch(self, i, weights, jobs, kw):
        return self.pool.submit(self.worker.run, weights, jobs, kw)

    def _offer(self, i, weights):
        self.worker.offer(weights)

    def _collect(self, call):
        return call.result()

    def _restart(self, i: int) -> None:
        self.stats["restarts"] += 1
        self.worker = self.pool.submit(RolloutWorker, self.cfg.model_dump(), 0).result()
        self.sent[0] = {}
        self.plays[0] = 0

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _adapter_state(local, adapter: str) -> dict:
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(local.model, adapter_name=adapter)
    return {k: t.detach().cpu().clone() for k, t in state.items()}


def _swap_binding(b, name_of):
    from dataclasses import replace

    return replace(b, ref=name_of(b.ref))


def _swap_job(j: Job, name_of) -> Job:
    """``j`` with each binding's model replaced by ``name_of(model)`` (a name a worker resolves, and back)."""
    from dataclasses import replace

    return replace(j, bindings={r: _swap_binding(b, name_of) for r, b in j.bindings.items()})


class RolloutWorker:
    """A Ray actor: the run's models, built once; runs its share of each step's jobs."""

    def __init__(self, cfg_dict: dict, index: int):
        import torch

        from .config import Config
        from .setup import build_models

        threads = cfg_dict.get("ray", {}).get("threads_per_worker") or 0
        if threads:
            torch.set_num_threads(threads)
        self.cfg = Config.model_validate(cfg_dict)
        self.index = index
        self.backends, _, _ = build_models(self.cfg)
        self.refs: dict[RefName, Any] = {}
        self.offered: list[tuple[int, dict, dict]] = []  # (seq, weights, live adapters) not yet applied
        self.applied = 0  # the newest hand-out applied
        self.lock = threading.Lock()
        self.playing = threading.Lock()
        self.turn = threading.Condition()
        self.next_play = 1  # the hand-out number (per worker, from 1) of the batch to play next

    def _ref(self, n: RefName):
        if n not in self.refs:
            if n.kind == "openai":
                from .models.openai_backend import OpenAIRef

                self.refs[n] = OpenAIRef.from_config(n.key, self.cfg.models[n.key], self.cfg.run.seed + self.index)
            else:
                self.refs[n] = ModelRef(id=n.id, backend=self.backends[n.key], adapter=n.adapter,
                                        trainable=n.trainable)
        return self.refs[n]

    def _sync(self, seq: int, send: dict, live: dict) -> None:
        """Apply one hand-out of weights: an adapter's (or the whole model's) only if it is not older than what this
        copy holds, and the deletions of adapters gone from the driver only if no newer hand-out was applied."""
        from peft import set_peft_model_state_dict

        for (key, adapter), obj in send.items():
            if not isinstance(obj, tuple):  # (a Ray object reference; in a thread, the weights themselves)
                import ray

                obj = ray.get(obj)
            version, state, acfg = obj
            local = getattr(self.backends[key], "local", self.backends[key])
            if (adapter is None or adapter in local.adapter_names()) and local.versions.get(adapter, 0) > version:
                continue
            b = self.backends[key]
            local = getattr(b, "local", b)
            if adapter is None:
                local.model.load_state_dict(state)
            else:
                if adapter not in local.adapter_names():
                    local.add_lora(adapter, **acfg)
                set_peft_model_state_dict(local.model, state, adapter_name=adapter)
            local.versions[adapter] = version
        if seq < self.applied:
            return
        self.applied = seq
        for key, names in live.items():
            local = getattr(self.backends[key], "local", self.backends[key])
            for a in local.adapter_names():
                if a not in names:
                    local.model.delete_adapter(a)
                    local.versions.pop(a, None)
                    self.refs = {n: r for n, r in self.refs.items() if not (n.key == key and n.adapter == a)}

    def offer(self, weights: tuple[int, dict, dict]) -> None:
        """Newer weights (seq, weights, live adapters), taken up between two turns of the batch under way, or at
        the start of the next."""
        with self.lock:
            self.offered.append(weights)

    def _take_offers(self) -> None:
        with self.lock:
            offers, self.offered = sorted(self.offered, key=lambda w: w[0]), []
        for seq, send, live in offers:
            self._sync(seq, send, live)

    def run(self, weights: tuple[int, dict, dict], jobs: list[Job], kw: dict):
        """Play ``jobs`` after applying ``weights`` (and any offered before them), one batch at a time, in the order
        they were handed out (``kw["play"]``: a threaded actor may receive the next batch's call before this one's,
        and the next batch's jobs may need weights that only this call carries, a pool snapshot say)."""
        play = kw.pop("play", None)
        with self.turn:
            if play is not None and not self.turn.wait_for(lambda: play <= self.next_play, timeout=PLAY_WAIT):
                self.next_play = play  # the call before it never came (a lost call): go on
        try:
            return self._play(weights, jobs, kw)
        finally:
            with self.turn:
                if play is not None:
                    self.next_play = max(self.next_play, play + 1)
                self.turn.notify_all()

    def _play(self, weights: tuple[int, dict, dict], jobs: list[Job], kw: dict):
        with self.playing:
            self.offer(weights)
            self._take_offers()
            if kw.pop("finish", False):  # rollout.stale: finish, partial rollouts: newer weights between turns
                kw["between_rounds"] = self._take_offers
            for j in jobs:
                j.bindings = {r: _swap_binding(b, self._ref) for r, b in j.bindings.items()}
            if kw.get("judge") is not None:
                kw = dict(kw, judge=_swap_binding(kw["judge"], self._ref))
            eps, stats = run_rollouts(jobs, **kw)
            for e in eps:
                e.meta["worker"] = self.index
            return eps, stats



def scale_metrics(rollout: Rollout, backends: dict) -> dict[str, float]:
    """Cumulative counters of the Ray workers (``ray/...``) and of each vLLM engine (``engine/<model>/...``)."""
    out: dict[str, float] = {}
    for k, v in rollout.stats.items():
        out[f"ray/{k}"] = float(v)
    for key, b in backends.items():
        for k, v in getattr(b, "stats", {}).items() if hasattr(b, "engine") else ():
            out[f"engine/{key}/{k}"] = float(v)
    return out
