"""The training loop: sample tasks, roll out G dialogues per task, update every trainable role.

    for step in steps:
        tasks    = sampler.next(n_tasks)
        jobs     = tasks x G, each role bound to its ModelRef
        episodes = run_rollouts(jobs)                 # batched across dialogues, token in / token out
        for role in trainable roles:
            adv  = group_advantages(episodes, role)   # z-score within each task's group
            learner[role].update(traces of role, adv)
        log metrics and rollouts; checkpoint every save_every steps
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from .config import Config, ConfigError
from .envs import get_env
from .learner import Learner, LearnerConfig, group_advantages
from .partners.pool import PoolSource
from .partners.rewards import apply_partner_reward, baseline_of
from .diagnostics import behaviour_stats, classifier_of, group_similarity
from .distributed import make_rollout, scale_metrics
from .rollout import Job, Play, make_jobs
from .run import Checkpointer, MetricsLogger, RunDir, publish_dir, recover_dir, rollout_records, save_weights
from .guards import check_start, endpoint_metrics, starting, stop_if_dead
from .setup import build_judge, build_models
from .types import Episode, Task

if TYPE_CHECKING:
    from .eval import ProbeStates


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
    try:
        if not job.main:
            parallel.follow(job, cfg, owners, configs)
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
        return out
    finally:
        job.close()


def _train(cfg: Config, tasks: list[Task], resume: bool, on_step_end, log, configs: dict[str, LearnerConfig],
           job=None) -> RunDir:
    from . import parallel

    t_load = time.time()
    with starting("models"):
        backends, sources, trainable = build_models(cfg)
        judge = build_judge(cfg, backends)
    log(f"loaded models {sorted(backends)} in {time.time() - t_load:.1f}s")
    run = RunDir(cfg.run.dir, cfg, resume=resume)  # only once everything the run needs is there
    owners = list(configs)
    local = parallel.build_learners(job, cfg, owners, configs, trainable) if job is not None else {}
    learners: dict[str, Any] = {   # one per trained set of weights
        o: (parallel.RemoteLearner(job, o, trainable[o], local.get(o)) if job is not None
            else Learner(trainable[o].backend, trainable[o].adapter, configs[o])) for o in owners}
    roles_of: dict[str, list[str]] = {}  # learner -> the roles whose tokens it trains on
    for role, rc in cfg.roles().items():
        if rc.trainable:
            roles_of.setdefault("agent" if rc.self_play else role, []).append(role)
    save_hook = None
    if job is not None:
        def save_hook(tmp: str) -> None:
            job.broadcast(("save", tmp))
            parallel.save_all(job, local, owners, tmp)
    pools = {r: s for r, s in sources.items() if isinstance(s, PoolSource)}
    rollout = make_rollout(cfg, backends)  # in this process, or in Ray workers
    sampler = TaskSampler(tasks, cfg.run.seed)
    env_rng = random.Random(cfg.run.seed + 1)
    ckpt = Checkpointer(run, cfg)
    start = 0
    if resume:
        start = ckpt.load_latest(backends, learners, sampler, env_rng, sources)
        if job is not None and ckpt.last_loaded is not None:  # each rank's share of the training state
            job.broadcast(("load", ckpt.last_loaded))
            parallel.load_all(job, local, owners, ckpt.last_loaded)
        log(f"resumed from step {start}")
    if start == 0:
        for pool in pools.values():
            pool.snapshot(0)  # the pool starts with the initial partner
    metrics_log = MetricsLogger(run, start_step=start)
    evaluator = PanelEval(cfg, backends, trainable["agent"], run, judge) \
        if cfg.eval.panel and "agent" in trainable else None
    classify = classifier_of(cfg.env.name)
    probe = PartnerProbe(cfg, run, tasks, classify)
    no_signal = {owner: 0 for owner in learners}
    dead_steps = 0  # consecutive steps in which every episode failed
    endpoint_seen: dict[str, dict[str, int]] = {}  # each endpoint's counters at the end of the last step
    log(f"training {list(learners)} on {len(tasks)} {cfg.env.name} tasks ({cfg.env.train_split}); "
        f"{cfg.rollout.n_tasks} tasks x G={cfg.rollout.group_size} per step; run dir {run.path}")
    if evaluator is not None and start == 0 and cfg.eval.at_start:
        metrics_log.write(0, evaluator.run(0, log))
    for step in range(start + 1, cfg.train.steps + 1):
        t0 = time.time()
        jobs = step_jobs(cfg, sampler.next(cfg.rollout.n_tasks), sources, step, env_rng)
        progress = (lambda s, step=step: log(f"  step {step} {s}")) if cfg.run.progress else None
        episodes, rstats = rollout(jobs, max_context=cfg.rollout.max_context,
                                        end_on_truncation=cfg.rollout.end_on_truncation, progress=progress,
                                        judge=judge)
        t1 = time.time()
        dead_steps = stop_if_dead(episodes, dead_steps, cfg.train.max_failed_steps, step)
        m: dict[str, float] = {"step": step, **episode_metrics(episodes), **endpoint_metrics(jobs, endpoint_seen),
                                **scale_metrics(rollout, backends)}
        m.update(step_diagnostics(cfg, step, jobs, episodes, classify))
        m.update(probe.run(step, jobs, episodes))
        if cfg.partner.reward != "env":
            apply_partner_reward(cfg.partner.reward, episodes, "partner")
        for owner, learner in learners.items():  # self-play: one learner, both roles' tokens
            m.update(update_learner(owner, learner, roles_of[owner], episodes, cfg))
            watch_signal(owner, m, no_signal, cfg.train.no_signal_warn, log)
        for role, pool in pools.items():
            pool.maybe_snapshot(step)
            m[f"{role}/pool_size"] = len(pool.members)
        t2 = time.time()
        if evaluator is not None and (step % cfg.eval.every == 0 or step == cfg.train.steps):
            m.update(evaluator.run(step, log))
        m.update(rollout_seconds=t1 - t0, train_seconds=t2 - t1, step_seconds=t2 - t0,
                 tokens_generated=rstats.tokens_generated,
                 tokens_per_second=rstats.tokens_generated / max(t1 - t0, 1e-9))
        metrics_log.write(step, m)
        if cfg.run.save_rollouts:
            run.write_rollouts(step, rollout_records(episodes))
        log(f"step {step}/{cfg.train.steps} reward {m['reward_mean']:.3f}±{m['reward_std']:.3f} "
            f"entropy {m.get('policy_entropy', float('nan')):.3f} zero-var {m.get('zero_variance_frac', 0):.2f} "
            f"turns {m['turns_mean']:.1f} failed {m['failed_episodes']} | rollout {t1 - t0:.1f}s "
            f"({m['tokens_per_second']:.0f} tok/s) train {t2 - t1:.1f}s")
        if step % cfg.run.save_every == 0 or step == cfg.train.steps:
            ckpt.save(step, backends, learners, sampler, env_rng, sources, before_publish=save_hook)
        if on_step_end:
            on_step_end(step)
    metrics_log.close()
    if hasattr(rollout, "close"):
        rollout.close()
    return run


class PanelEval:
    """Evaluation on the held-out panel every ``eval.every`` steps; keeps the best adapter in RUN_DIR/best."""

    def __init__(self, cfg: Config, backends: dict, agent_ref, run: RunDir, judge=None):
        from .eval import frozen_refs, load_panel
        from .panels import run_sharing
        from .partners.binding import spec_binding

        self.cfg, self.rundir, self.judge = cfg, run, judge
        if cfg.eval.panel is None:  # (train makes one only for a config with a panel)
            raise ConfigError("invalid panel: eval.panel is not set")
        self.panel = load_panel(cfg.eval.panel)
        models = dict(cfg.models)
        models.update(self.panel.models)
        self.refs = frozen_refs(models, backends, cfg.run.seed)
        self.agent, self.agent_ref = spec_binding(cfg.agent, agent_ref), agent_ref
        self.sharing = run_sharing(cfg, self.panel)
        recover_dir(run.file("best"))  # a crash while best/ was being replaced
        self.best_path = run.file("best", "best.json")
        self.best = json.load(open(self.best_path))["score"] if os.path.exists(self.best_path) else -math.inf

    def run(self, step: int, log: Callable[[str], None]) -> dict[str, float]:
        from .eval import evaluate, write_results

        c = self.cfg
        res = evaluate(self.agent, self.panel, self.refs, c.env.name, c.env.options,
                       self.panel.split or c.env.eval_split, max_context=c.rollout.max_context,
                       end_on_truncation=c.rollout.end_on_truncation, judge=self.judge, sharing=self.sharing)
        write_results(res, self.rundir.file("eval", f"step_{step:06d}"), f"step {step}")
        out = {f"eval/{k}": res[k] for k in ("panel_mean", "panel_std", "seen_mean", "unseen_mean", "panel_se",
                                              "seen_se", "unseen_se", "control_mean", "control_se")
               if k in res and not math.isnan(res[k])}
        out.update({f"eval/partner/{k}": v["mean"] for k, v in res["per_partner"].items()})
        score = res["seen_mean"] if c.eval.select_on == "seen" else res["panel_mean"]
        if not math.isnan(score) and score > self.best:
            self.best = score
            ref = self.agent_ref
            tmp = self.rundir.file("best.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            save_weights(ref.backend, ref.adapter, tmp)
            with open(os.path.join(tmp, "best.json"), "w") as fh:
                json.dump({"step": step, "score": score, "select_on": c.eval.select_on, **out}, fh, indent=1)
            publish_dir(tmp, self.rundir.file("best"))
            out["eval/best_step"] = step
        log(f"  eval step {step}: panel {res['panel_mean']:.3f}±{res['panel_std']:.3f} seen {res['seen_mean']:.3f} "
            f"unseen {res['unseen_mean']:.3f} (best {self.best:.3f})")
        return out


def update_learner(owner: str, learner: Learner, roles: list[str], episodes: list[Episode],
                   cfg: Config) -> dict[str, float]:
    """One update from the traces of ``roles``, each role with its own advantages (within each task's
    group, or across the step for a reward that is constant within a group)."""
    m: dict[str, float] = {}
    traces, advs = [], []
    for role in roles:
        rc = cfg.roles()[role]
        adv, gstats = group_advantages(episodes, role, cfg.train.success_threshold,
                                       baseline=baseline_of(rc.reward if role != "agent" else "env", rc.baseline))
        for i, ep in enumerate(episodes):
            ep.meta.setdefault("advantage", {})[role] = adv[i]
        traces += [ep.traces[role] for ep in episodes]
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


def step_diagnostics(cfg: Config, step: int, jobs: list[Job], episodes: list[Episode],
                     classify) -> dict[str, float]:
    """Within-group similarity, partner behaviour modal mass and (every decompose_every steps) the
    partner/agent variance split, which draws on noise of its own (seeded by the run's seed and the step)
    and gives the models' sampling generators back as it found them: turning it on changes no training
    number."""
    m = {f"agent_{k}": v for k, v in group_similarity(episodes, "agent").items()}
    if classify is not None:  # at the states this step's rollouts shared (moves with the agent: see PartnerProbe)
        b = behaviour_stats(episodes, classify, "partner")
        b["visited_modal_mass"] = b.pop("modal_mass", float("nan"))
        m.update({f"partner_behaviour/{k}": v for k, v in b.items() if not (isinstance(v, float) and math.isnan(v))})
    d = cfg.diagnostics
    if d.decompose_every and step % d.decompose_every == 0:
        m.update(decompose(cfg, jobs, episodes, random.Random(cfg.run.seed * 1_000_003 + step), classify))
    return m


class PartnerProbe:
    """The partner's behaviour modal mass at fixed probe states (see :class:`scope.eval.ProbeStates`): the
    states are taken at step 1 and kept in RUN_DIR/probes.json (a resumed run reads them back)."""

    def __init__(self, cfg: Config, run: RunDir, tasks: list[Task], classify):
        d = cfg.diagnostics
        self.cfg, self.classify, self.on = cfg, classify, classify is not None and d.probe_every > 0
        self.path = run.file("probes.json")
        self.tasks = {t.id: t for t in tasks}
        self.states: ProbeStates | None = None

    def run(self, step: int, jobs: list[Job], episodes: list[Episode]) -> dict[str, float]:
        from .eval import ProbeStates

        d = self.cfg.diagnostics
        if not self.on or (step != 1 and step % d.probe_every):
            return {}
        if self.states is None:
            if os.path.exists(self.path):
                self.states = ProbeStates.load(self.path)
            else:
                self.states = ProbeStates.from_episodes(episodes, d.probe_states)
                self.states.save(self.path)
        out = self.states.measure(self.tasks, [j.bindings["partner"] for j in jobs], jobs[0].bindings["agent"].sampling,
                                  self.cfg.env.name, self.cfg.env.options, d.probe_samples, self.classify,
                                  seed=self.cfg.run.seed * 7919 + step, max_context=self.cfg.rollout.max_context)
        return {f"partner_behaviour/{k}": v for k, v in out.items()}


def decompose(cfg: Config, jobs: list[Job], episodes: list[Episode], rng: random.Random,
              classify=None) -> dict[str, float]:
    """Partner/agent split of the reward variance, within each task, on ``decompose_samples`` rollouts of
    each of ``decompose_tasks`` of this step's tasks (their agent turns replayed against resampled
    partners); with a classifier, also the partner's modal mass at those replayed states."""
    from .eval import fixed_sampling, nested_variance

    d = cfg.diagnostics
    binding = {id(j.episode): j.bindings["partner"] for j in jobs}
    tasks = {j.episode.task_id: j.env.task for j in jobs}
    groups: dict[str, list[Episode]] = {}
    for e in episodes:
        if not e.failed:
            groups.setdefault(e.group_id, []).append(e)
    firsts = [e for g in list(groups.values())[:d.decompose_tasks] for e in g[:d.decompose_samples]]
    with fixed_sampling([binding[id(e)].ref for e in firsts], rng.randrange(2**31)):
        v = nested_variance(firsts, tasks, jobs[0].bindings["agent"].sampling, lambda e: binding[id(e)], cfg.env.name,
                            cfg.env.options, d.decompose_resamples, random.Random(rng.random()),
                            max_context=cfg.rollout.max_context, classify=classify,
                            end_on_truncation=cfg.rollout.end_on_truncation)
    return {f"collapse/{k}_var" if k in ("total", "partner", "agent") else f"collapse/{k}": val
            for k, val in v.items() if not math.isnan(val)}


def coop_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Cooperative coding's step metrics from each episode's ``meta.coop``: pair success rate, merge
    outcomes, messages per episode (both coders), turns to submit (mean over coders), malformed replies."""
    cs = [e.meta["coop"] for e in episodes if isinstance(e.meta.get("coop"), dict)]
    if not cs:
        return {}
    n = len(cs)
    turns = [t for c in cs for t in (c.get("turns_to_submit") or {}).values() if t is not None]
    out = {"coop/success_rate": sum(bool(c.get("success")) for c in cs) / n,
           "coop/conflict_rate": sum(bool(c.get("conflicts")) for c in cs) / n,
           "coop/messages_per_episode": sum(sum((c.get("messages") or {}).values()) for c in cs) / n,
           "coop/malformed_per_episode": sum(sum((c.get("malformed") or {}).values()) for c in cs) / n,
           "coop/apply_error_rate": sum(bool(c.get("apply_errors")) for c in cs) / n}
    for status in ("clean", "union", "failed"):
        out[f"coop/merge_{status}"] = sum(c.get("merge") == status for c in cs) / n
    if turns:
        out["coop/turns_to_submit"] = sum(turns) / len(turns)
    return out


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    ok = [e for e in episodes if not e.failed]
    rewards = [e.rewards.get("agent", 0.0) for e in ok]
    turns = [sum(e.meta.get("turns", {}).values()) for e in ok]
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
        out[f"truncated_replies/{role}"] = sum(e.meta.get("truncated_replies", {}).get(role, 0) for e in episodes)
    out.update(coop_metrics(ok))
    sims = [e.meta["envsim"] for e in ok if isinstance(e.meta.get("envsim"), dict)]
    if sims:  # tau2 with simulated tools: how faithfully the simulator played them
        n = sum(x["calls"] for x in sims) or 1
        out.update({"envsim/fm": sum(x["fm"] * x["calls"] for x in sims) / n,
                    "envsim/cm": sum(x["cm"] * x["calls"] for x in sims) / n,
                    "envsim/accuracy": sum(x["accuracy"] * x["calls"] for x in sims) / n,
                    "envsim/calls_per_episode": sum(x["calls"] for x in sims) / len(sims)})
    vs = [v for e in episodes for v in e.meta.get("vs", [])]
    if vs:
        out["vs/fallback_frac"] = sum(v.get("fallback", False) for v in vs) / len(vs)
        out["vs/reasks_mean"] = float(np.mean([v["attempts"] - 1 for v in vs]))
    return out
