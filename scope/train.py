"""The training loop: sample tasks, roll out G dialogues per task, update every trained model.

    for step in steps:
        jobs     = step_jobs(sampler.next(n_tasks))      # tasks x G, each role bound by its partner source
        episodes = rollout(jobs)                         # batched across dialogues, token in / token out
        metrics  = episode_metrics + step_diagnostics + probe.run   # what scope.monitor measures
        for each learner:                                # the agent's, a trained partner's
            adv = group_advantages(episodes, role)       # per role, within each task's group
            learner.update(traces of its roles, adv)
        pools snapshot; evaluator.run every eval.every steps (the held-out panel)
        log metrics and rollouts; checkpoint every save_every steps

Under torchrun rank 0 runs this loop and the other ranks follow its commands (``scope.parallel``).
"""
from __future__ import annotations

import random
import time
from typing import Callable

import numpy as np
import torch

from .config import Config
from .envs.base import Env, get_env
from .learner import Learner, LearnerConfig, group_advantages
from .memory import allocator
from .partners.binding import SnapshotSource
from .partners.pool import PoolSource
from .partners.rewards import apply_partner_reward, baseline_of
from .diagnostics import classifier_of
from .rollout_workers import make_rollout, scale_metrics
from .rollout import Job, Play, make_jobs
from .pipeline import Feed, staleness
from .monitor import PanelEval, PartnerProbe, step_diagnostics
from .plot import run_plots
from .alarms import Watch, switched_by, write_summary
from .run import Checkpointer, MetricsLogger, RunDir, eta, read_metrics, rollout_records
from .guards import check_start, endpoint_metrics, starting, stop_if_dead
from .setup import build_judge, build_models, fallback_source
from .types import Episode, Task, Trace


class TaskSampler:
    """Draws tasks without replacement, reshuffling (seeded) at every pass over the task list."""

    def __init__(self, tasks: list[Task], seed: int):
        if not tasks:
            raise ValueError("no tasks to train on")
        self.tasks, self.rng = tasks, random.Random(seed)
        self.order: list[int] = []

    def next(self, n: int) -> list[Task]:
        out: list[Task] = []
        while len(out) < n:
            if not self.order:
                self.order = list(range(len(self.tasks)))
                self.rng.shuffle(self.order)
            out.append(self.tasks[self.order.pop()])
        return out

    def state_dict(self):
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def load_state_dict(self, sd):
        self.rng.setstate(sd["rng"])
        self.order = list(sd["order"])


def step_jobs(cfg: Config, tasks: list[Task], sources: dict, step: int, env_rng: random.Random) -> list[Job]:
    """G copies of each task; every role's source binds who plays it in each copy."""
    plays = [Play(task, Episode(task_id=task.id, group_id=f"{step}:{ti}:{task.id}", copy=g),
                  {role: src.assign(task, ti, g) for role, src in sources.items()})
             for ti, task in enumerate(tasks) for g in range(cfg.rollout.group_size)]
    return make_jobs(get_env(cfg.env.name), plays, cfg.env.options, env_rng, "train")


def next_checkpoint(step: int, cfg: Config) -> int:
    """The first step at or after ``step`` whose end saves a checkpoint (asynchronous rollouts submit nothing past
    it, so that a checkpoint never holds rollouts under way)."""
    every = cfg.run.save_every
    return min(-(-step // every) * every, cfg.train.steps)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def learner_config(cfg: Config, owner: str) -> LearnerConfig:
    """The learner settings of a trained model: the run's ``train`` section, with its role's lr and KL."""
    rc = cfg.roles()[owner]
    return LearnerConfig(**cfg.train.model_dump(exclude={"steps", "success_threshold", "no_signal_warn",
                                                         "max_failed_steps", "lr", "kl_coef"}),
                         lr=rc.lr or cfg.train.lr, temperature=rc.temperature,
                         kl_coef=cfg.train.kl_coef if rc.kl_coef is None else rc.kl_coef)


def train(cfg: Config, resume: bool = False, on_step_end: Callable[[int], None] | None = None,
          log: Callable[[str], None] = print) -> RunDir | None:
    """Run ``cfg``'s training. Under torchrun (``scope.parallel``) rank 0 runs this loop and the other ranks
    follow its commands; they return None."""
    from . import parallel

    tasks = check_start(cfg, resume)  # data, splits, panel: before anything is loaded or written
    seed_all(cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    owners = parallel.owners_of(cfg)
    configs = {o: learner_config(cfg, o) for o in owners}
    job = parallel.start(cfg, owners)
    if job is None:
        return _train(cfg, tasks, resume, on_step_end, log, configs)
    ended = False  # a normal end, which every rank reaches
    try:
        if not job.main:
            parallel.follow(job, cfg, owners, configs)
            ended = True
            return None
        try:
            out = _train(cfg, tasks, resume, on_step_end, log, configs, job)
        except BaseException as e:
            try:  # the other ranks end too, naming the reason
                job.broadcast(("stop", f"{type(e).__name__}: {e}"))
            except Exception:  # noqa: BLE001 - a rank is gone already: torchrun stops the rest
                pass
            raise
        job.broadcast(("stop", None))
        ended = True
        return out
    finally:
        job.close(together=ended)


def _train(cfg: Config, tasks: list[Task], resume: bool, on_step_end, log, configs: dict[str, LearnerConfig],
           job=None) -> RunDir:
    t_load = time.time()
    with starting("models"):
        backends, sources, trainable = build_models(cfg)
        judge = build_judge(cfg, backends)
    log(f"loaded models {sorted(backends)} in {time.time() - t_load:.1f}s")
    run = RunDir(cfg.run.dir, cfg, resume=resume)  # only once everything the run needs is there
    learners, shares = make_learners(cfg, configs, trainable, job)
    roles_of = trained_roles(cfg)
    pools: dict[str, SnapshotSource] = {r: s for r, s in sources.items() if isinstance(s, PoolSource)}
    rollout = make_rollout(cfg, backends)  # in this process, or in Ray workers
    sampler, env_rng = TaskSampler(tasks, cfg.run.seed), random.Random(cfg.run.seed + 1)
    ckpt = Checkpointer(run, cfg)
    if resume and ckpt.list() and switched_by(run.path, int(ckpt.list()[-1][len("step_"):])) is not None:
        sources["partner"] = fallback_source(cfg, backends)  # a switch alarm had fired before the checkpoint
    start = resume_from(ckpt, backends, learners, sampler, env_rng, sources, shares, log) if resume else 0
    if start and cfg.rollout.max_staleness:
        log("asynchronous rollouts: a checkpoint holds no rollouts under way; what was under way when the run "
            "stopped was discarded, and its steps are drawn and generated again")
    if start == 0:
        for pool in pools.values():
            pool.snapshot(0)  # the pool starts with the initial partner
    metrics_log = MetricsLogger(run, cfg, start_step=start)
    watch = Watch(cfg, run.path, log) if cfg.monitor.alarms else None
    evaluator = PanelEval(cfg, backends, trainable["agent"], run, judge) \
        if cfg.eval.panel and "agent" in trainable else None
    if evaluator is not None and evaluator.warning:
        log(f"WARNING: {evaluator.warning}")
    classify = classifier_of(cfg.env.name)
    probe = PartnerProbe(cfg, run, tasks, classify)
    no_signal = {owner: 0 for owner in learners}  # consecutive steps without a learning signal
    dead_steps = 0  # consecutive steps in which every episode failed
    endpoint_seen: dict[str, dict[str, int]] = {}  # each endpoint's counters at the end of the last step
    log(f"training {list(learners)} on {len(tasks)} {cfg.env.name} tasks ({cfg.env.train_split}); "
        f"{cfg.rollout.n_tasks} tasks x G={cfg.rollout.group_size} per step; run dir {run.path}; "
        f"allocator {allocator()}")
    if evaluator is not None and start == 0 and (cfg.eval.at_start or cfg.train.steps == 0):
        metrics_log.write(0, evaluator.run(0, log))  # (steps 0: the policy as built, evaluated once)
    feed = Feed(rollout, cfg.rollout.max_staleness, cfg.rollout.stale,  # (scope.pipeline: K steps ahead)
                lambda s: step_jobs(cfg, sampler.next(cfg.rollout.n_tasks), sources, s, env_rng),
                dict(max_context=cfg.rollout.max_context, end_on_truncation=cfg.rollout.end_on_truncation,
                     judge=judge),
                (lambda step: lambda s: log(f"  step {step} {s}")) if cfg.run.progress else None)
    owned = {o: (trainable[o], roles_of[o]) for o in learners}
    t_loop = time.time()
    for step in range(start + 1, cfg.train.steps + 1):
        t0 = time.time()
        jobs, episodes, rstats, pipe = feed.take(step, horizon=next_checkpoint(step, cfg))
        t1 = time.time()
        for role, rc in cfg.roles().items():  # a reward of the config's instead of the environment's
            if rc.reward != "env":
                apply_partner_reward(rc.reward, episodes, role)
        dead_steps = stop_if_dead(episodes, dead_steps, cfg.train.max_failed_steps, step)
        metrics: dict[str, float] = {"step": step, **episode_metrics(episodes, get_env(cfg.env.name)),
                                     **endpoint_metrics(jobs, endpoint_seen), **scale_metrics(rollout, backends),
                                     **step_diagnostics(cfg, step, jobs, episodes, classify),
                                     **probe.run(step, jobs, episodes)}
        trained = {o: episodes for o in learners}
        if cfg.rollout.max_staleness:  # each learner's episodes within the bound (scope.pipeline)
            trained, stale_m = staleness(episodes, owned, cfg.rollout.max_staleness, cfg.rollout.stale)
            metrics.update(pipe, **stale_m)
        for owner, learner in learners.items():  # self-play: one learner, both roles' tokens
            metrics.update(update_learner(owner, learner, roles_of[owner], trained[owner], cfg))
            watch_signal(owner, metrics, no_signal, cfg.train.no_signal_warn, log)
        feed.published()
        for role, pool in pools.items():
            pool.maybe_snapshot(step)
            metrics[f"{role}/pool_size"] = len(pool.members)
        t2 = time.time()
        if evaluator is not None and (step % cfg.eval.every == 0 or step == cfg.train.steps):
            metrics.update(evaluator.run(step, log))
        gen = rstats.seconds if cfg.rollout.max_staleness else t1 - t0  # (async: the generator's own time)
        metrics.update(rollout_seconds=gen, train_seconds=t2 - t1, step_seconds=t2 - t0,
                       tokens_generated=rstats.tokens_generated,
                       tokens_per_second=rstats.tokens_generated / max(gen, 1e-9))
        action = watch.step(step, metrics) if watch is not None else None  # collapse alarms (scope.alarms)
        metrics_log.write(step, metrics)
        if cfg.run.save_rollouts:
            run.write_rollouts(step, rollout_records(episodes))
        log(f"{step_line(step, cfg.train.steps, metrics)} | "
            f"{eta(time.time() - t_loop, step - start, cfg.train.steps - step)}")
        if step % cfg.run.save_every == 0 or step == cfg.train.steps or action == "stop":
            ckpt.save(step, backends, learners, sampler, env_rng, sources, before_publish=shares and shares.save)
        if on_step_end:
            on_step_end(step)
        if action == "switch":  # the partner plays monitor.fallback from the next step on
            sources["partner"] = fallback_source(cfg, backends)
        if action == "stop":
            log(f"stopped: {metrics['stop_reason']}")
            break
    dropped = feed.close()
    if dropped:
        log(f"discarded the {dropped} steps' rollouts under way (asynchronous rollouts)")
    if watch is not None:
        write_summary(run.path, read_metrics(run.path))
    metrics_log.close(run_plots(run.path) if metrics_log.wants_plots else None)
    rollout.close()
    return run


def make_learners(cfg: Config, configs: dict[str, LearnerConfig], trainable: dict, job=None):
    """One learner per trained set of weights: in this process, or (under torchrun) rank 0's handles on the
    ranks that hold them, with the :class:`RankShares` that have every rank save and load its share."""
    from . import parallel

    owners = list(configs)
    if job is None:
        return {o: Learner(trainable[o].backend, trainable[o].adapter, configs[o]) for o in owners}, None
    local = parallel.build_learners(job, cfg, owners, configs, trainable)
    learners = {o: parallel.RemoteLearner(job, o, trainable[o], local.get(o)) for o in owners}
    return learners, RankShares(job, local, owners)


class RankShares:
    """Under torchrun: each rank's share of the training state, written and read beside rank 0's checkpoint."""

    def __init__(self, job, local: dict, owners: list[str]):
        self.job, self.local, self.owners = job, local, owners

    def save(self, tmp: str) -> None:
        from . import parallel

        self.job.broadcast(("save", tmp))
        parallel.save_all(self.job, self.local, self.owners, tmp)

    def load(self, path: str) -> None:
        from . import parallel

        self.job.broadcast(("load", path))
        parallel.load_all(self.job, self.local, self.owners, path)


def resume_from(ckpt: Checkpointer, backends, learners, sampler, env_rng, sources, shares: RankShares | None,
                log: Callable[[str], None]) -> int:
    """Load the latest checkpoint (and each rank's share of it); the step it was saved at."""
    start = ckpt.load_latest(backends, learners, sampler, env_rng, sources)
    if shares is not None and ckpt.last_loaded is not None:
        shares.load(ckpt.last_loaded)
    log(f"resumed from step {start}")
    return start


def trained_roles(cfg: Config) -> dict[str, list[str]]:
    """Learner -> the roles whose tokens it trains on (a self-play partner's go to the agent's learner)."""
    out: dict[str, list[str]] = {}
    for role, rc in cfg.roles().items():
        if rc.trainable:
            out.setdefault("agent" if rc.self_play else role, []).append(role)
    return out


def step_line(step: int, steps: int, m: dict[str, float]) -> str:
    return (f"step {step}/{steps} reward {m['reward_mean']:.3f}±{m['reward_std']:.3f} "
            f"entropy {m.get('policy_entropy', float('nan')):.3f} zero-var {m.get('zero_variance_frac', 0):.2f} "
            f"turns {m['turns_mean']:.1f} failed {m['failed_episodes']} | rollout {m['rollout_seconds']:.1f}s "
            f"({m['tokens_per_second']:.0f} tok/s) train {m['train_seconds']:.1f}s")


def update_learner(owner: str, learner: Learner, roles: list[str], episodes: list[Episode],
                   cfg: Config) -> dict[str, float]:
    """One update from the traces of ``roles``, each role with its own advantages (within each task's
    group, or across the step for a reward that is constant within a group)."""
    m: dict[str, float] = {}
    traces, advs = [], []
    for role in roles:
        rc = cfg.roles()[role]
        adv, gstats = group_advantages(episodes, role, cfg.train.success_threshold,
                                       baseline=baseline_of(rc.reward, rc.baseline))
        for ep, a in zip(episodes, adv):
            if a is not None:  # (a failed episode has none)
                ep.advantage[role] = a
        traces += [ep.traces.get(role) or Trace(role) for ep in episodes]  # (a failed episode may have none)
        advs += adv
        prefix = "" if role == "agent" else f"{role}/"
        m.update({f"{prefix}{k}": v for k, v in gstats.fractions().items()})
        rs = [ep.rewards[role] for ep in episodes if not ep.failed and role in ep.rewards]
        if role != "agent" and rs:
            m[f"{role}/reward_mean"] = float(np.mean(rs))
    out = learner.update(traces, advs)
    prefix = "" if owner == "agent" else f"{owner}/"
    m.update({(k if k.startswith("rank") else f"{prefix}train/{k}"): v for k, v in out.items()})  # (per-rank: as is)
    m[f"{prefix}train/nonzero_adv_frac"] = (sum(1 for a in advs if a) / len(advs)) if advs else 0.0
    if "entropy" in out:
        m[f"{prefix}policy_entropy"] = out["entropy"]
    return m


def watch_signal(owner: str, m: dict[str, float], counts: dict[str, int], warn_after: int,
                 log: Callable[[str], None]) -> None:
    """Count the consecutive steps in which ``owner``'s update carried no signal (no non-zero advantage,
    or a zero gradient); log ``train/no_signal_steps`` and warn loudly once it reaches ``warn_after``."""
    prefix = "" if owner == "agent" else f"{owner}/"
    silent = m.get(f"{prefix}train/nonzero_adv_frac", 0.0) == 0.0 or m.get(f"{prefix}train/grad_norm", 0.0) == 0.0
    counts[owner] = counts[owner] + 1 if silent else 0
    m[f"{prefix}train/no_signal_steps"] = counts[owner]
    n = counts[owner]
    if n >= warn_after and (n == warn_after or n % 10 == 0):
        log(f"WARNING: the {owner} has learned nothing for {n} consecutive steps: every advantage was 0 "
            f"(each group's rewards were equal) or the gradient was 0. Its weights are not moving; check its "
            f"reward ({prefix}zero_variance_frac, {prefix}reward_mean).")


def episode_metrics(episodes: list[Episode], env_cls: type[Env] | None = None) -> dict[str, float]:
    """The step's reward, turns, end reasons, tokens and truncations, and ``env_cls``'s own step metrics."""
    ok = [e for e in episodes if not e.failed]
    rewards = [e.rewards.get("agent", 0.0) for e in ok]
    turns = [sum(e.turns.values()) for e in ok]
    statuses: dict[str, int] = {}
    for e in episodes:
        statuses[e.status] = statuses.get(e.status, 0) + 1
    out = {"reward_mean": float(np.mean(rewards)) if rewards else 0.0,
           "reward_std": float(np.std(rewards)) if rewards else 0.0,
           "turns_mean": float(np.mean(turns)) if turns else 0.0,
           "episodes": len(episodes), "failed_episodes": len(episodes) - len(ok)}
    for s, n in statuses.items():
        out[f"status/{s}"] = n / len(episodes)
    for role in ("agent", "partner"):
        gen = [e.traces[role].n_generated for e in ok if role in e.traces]
        if gen:
            out[f"{role}_tokens_mean"] = float(np.mean(gen))
        out[f"truncated_replies/{role}"] = sum(e.truncated_replies.get(role, 0) for e in episodes)
    if env_cls is not None:
        out.update(env_cls.step_metrics(ok))
    vs = [v for e in episodes for v in e.vs]
    if vs:
        out["vs/fallback_frac"] = sum(v.get("fallback", False) for v in vs) / len(vs)
        out["vs/reasks_mean"] = float(np.mean([v["attempts"] - 1 for v in vs]))
    return out
