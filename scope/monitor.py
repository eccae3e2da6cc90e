"""What the training loop measures besides training: the held-out panel every ``eval.every`` steps
(:class:`PanelEval`), the partner's behaviour at fixed probe states (:class:`PartnerProbe`), and each step's
collapse diagnostics, the partner/agent variance split among them (:func:`step_diagnostics`)."""
from __future__ import annotations

import json
import math
import os
import random
import shutil
from typing import TYPE_CHECKING, Callable

from .config import Config, ConfigError
from .diagnostics import behaviour_stats, group_similarity
from .rollout import Job
from .run import RunDir, publish_dir, recover_dir, save_weights
from .types import Episode, Task

if TYPE_CHECKING:
    from .eval import ProbeStates


class PanelEval:
    """Evaluation on the held-out panel every ``eval.every`` steps; keeps the best adapter in RUN_DIR/best."""

    def __init__(self, cfg: Config, backends: dict, agent_ref, run: RunDir, judge=None):
        from .eval import load_panel
        from .models.loading import frozen_refs
        from .panels import family_warning, run_sharing
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
        self.warning = family_warning(self.panel, self.sharing)  # a line for the log (every unseen member of a
        # training simulator's family), or None
        recover_dir(run.file("best"))  # a crash while best/ was being replaced
        self.best_path = run.file("best", "best.json")
        self.best = json.load(open(self.best_path))["score"] if os.path.exists(self.best_path) else -math.inf

    def run(self, step: int, log: Callable[[str], None]) -> dict[str, float]:
        from .eval import evaluate, write_results

        c = self.cfg
        res = evaluate(self.agent, self.panel, self.refs, c.env, self.panel.split or c.env.eval_split,
                       max_context=c.rollout.max_context, end_on_truncation=c.rollout.end_on_truncation,
                       judge=self.judge, sharing=self.sharing,
                       progress=(lambda s: log(f"  eval at step {step}: {s}")) if c.run.progress else None)
        write_results(res, self.rundir.file("eval", f"step_{step:06d}"), f"step {step}")
        out = {f"eval/{k}": res[k] for k in ("panel_mean", "panel_std", "seen_mean", "unseen_mean", "panel_se",
                                              "seen_se", "unseen_se", "control_mean", "control_se",
                                              "unseen_same_family_mean", "unseen_same_family_se",
                                              "unseen_other_family_mean", "unseen_other_family_se")
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
