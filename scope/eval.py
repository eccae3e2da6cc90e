"""Held-out evaluation panels and partner diagnosis.

A panel is a list of partner specs, each marked ``seen`` (trained against) or ``unseen``. The agent
plays ``episodes`` dialogues against each on the evaluation split, at the evaluation temperature
(default 0). Reported: per-partner mean reward, the panel mean and std across partners, and the
seen and unseen means, as JSON and as a markdown table.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import random
from typing import Any, Callable

import yaml
from pydantic import Field, ValidationError

from .config import ConfigError, EnvConfig, ModelConfig, PartnerSpec, Strict, format_validation_error
from .models.loading import load_frozen_adapter
from .diagnostics import behaviour_stats, classifier_of, group_similarity, variance_decomposition
from .envs.base import get_env
from .envs.tasks import load_tasks
from .partners.binding import Binding, spec_binding
from .rollout import Job, Play, make_jobs, run_rollouts
from .types import Completion, Episode, SamplingParams


class PanelEntry(PartnerSpec):
    seen: bool = False
    control: bool = False
    """A control (evaluation only, e.g. a simulator played another way): reported in its own group, left out
    of the seen, unseen and panel means."""
    personas: str | None = None
    """A persona pool (``builtin``, a JSON file, the ``personas.json`` of ``scope personas evolve``): the
    partner plays its personas in turn, one per episode (appended to its system prompt)."""
    adapter: str | None = None
    """Cross-play: a trained LoRA adapter that plays this partner on ``model`` (frozen): an adapter
    directory (``adapter_config.json``), or a checkpoint directory, whose ``partner`` adapter is taken
    (its ``agent`` adapter when it has none, as in self-play runs)."""
    env_options: dict[str, Any] = {}
    """Environment options for this partner's episodes, over the run's (e.g. a customer that needs a third
    turn plays with ``max_turns: 3``); checked against the environment's declared options and types."""


class Panel(Strict):
    models: dict[str, ModelConfig] = {}
    partners: list[PanelEntry]
    episodes: int | None = Field(default=None, ge=1)
    """Episodes per partner, cycling through the split's tasks; None: every task of the split,
    ``repeats`` times."""
    repeats: int = Field(default=1, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    """The agent's sampling temperature during evaluation."""
    split: str | None = None
    tasks: int | None = Field(default=None, ge=1)
    """Only the first N tasks of the split (episodes cycle through them)."""
    paired: bool = False
    """Every agent reply is scored by every partner: the agent plays each (task, copy) once, against the first
    partner, and its turn is replayed verbatim to the others (for environments where the agent speaks once,
    before any partner reply can change what it says)."""
    seed: int = 0
    """The evaluation seed: every evaluation of a panel draws the same tasks order, environment seeds
    and sampling noise, whatever the training step (common random numbers across checkpoints)."""


def load_panel(path_or_data: str | dict) -> Panel:
    if isinstance(path_or_data, str):
        if not os.path.exists(path_or_data):
            raise ConfigError(f"panel file {path_or_data} not found")
        with open(path_or_data) as f:
            data = yaml.safe_load(f) or {}
    else:
        data = path_or_data
    try:
        panel = Panel.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e).replace("invalid config", "invalid panel")) from None
    ids = [p.spec_id() for p in panel.partners]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"invalid panel: partner ids repeat: {ids}")
    return panel


@contextlib.contextmanager
def fixed_sampling(refs: list[Any], seed: int):
    """Seed the sampling generators of the local models behind ``refs`` for the block, then give each
    back the state it had (an evaluation neither depends on nor disturbs the training's noise)."""
    gens = {}
    for r in refs:
        b = getattr(r, "backend", None)
        if b is not None and id(b) not in gens:
            gens[id(b)] = (b.generator, b.generator.get_state())
    try:
        for k, (g, _) in enumerate(gens.values()):
            g.manual_seed(seed * 1_000_003 + k)
        yield
    finally:
        for g, state in gens.values():
            g.set_state(state)


def panel_jobs(agent: Binding, panel: Panel, refs: dict[str, Any], env: EnvConfig, split: str,
               seed: int) -> tuple[list[Job], list[PanelEntry]]:
    env_cls, env_options = get_env(env.name), env.options
    tasks = load_tasks(env, split)[:panel.tasks]
    if not tasks:
        raise ValueError(f"no {env.name} tasks in split {split!r}")
    n = panel.episodes if panel.episodes is not None else len(tasks) * panel.repeats
    rng = random.Random(seed)
    plays: list[Play] = []
    owner: list[PanelEntry] = []
    for p in panel.partners:
        if p.model not in refs:
            raise ConfigError(f"panel partner {p.spec_id()!r}: model {p.model!r} is not defined")
        ref = refs[p.model]
        if p.adapter is not None:  # cross-play: another run's trained partner
            ref = load_frozen_adapter(ref, p.adapter, f"xplay_{p.spec_id()}".replace(".", "_").replace("-", "_"))
        b = spec_binding(p, ref)
        opts = dict(env_options)
        if p.env_options:
            try:
                opts.update(env_cls.check_options(p.env_options, where=f"panel partner {p.spec_id()!r}: env_options"))
            except ValueError as e:
                raise ConfigError(str(e)) from None
        personas = None
        if p.personas is not None:
            from .partners.sources import load_personas

            try:
                personas = load_personas(p.personas)
            except (FileNotFoundError, ValueError) as e:
                raise ConfigError(f"panel partner {p.spec_id()!r}: {e}") from None
        for i in range(n):
            task = tasks[i % len(tasks)]
            ep = Episode(task_id=task.id, group_id=f"eval:{p.spec_id()}:{task.id}", copy=i // len(tasks))
            bi = b
            if personas:
                per = personas[i % len(personas)]
                bi = b.with_persona(per["text"])
                ep.meta["sim_persona"] = per["id"]
            plays.append(Play(task, ep, {"agent": agent, "partner": bi}, options=opts))
            owner.append(p)
    return make_jobs(env_cls, plays, env_options, rng, "eval"), owner


def evaluate(agent: Binding, panel: Panel, refs: dict[str, Any], env: EnvConfig, split: str,
             seed: int | None = None, max_context: int = 4096, end_on_truncation: bool = True,
             judge: Binding | None = None, sharing: dict[str, Any] | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The agent against every panel partner. ``seed`` defaults to the panel's own (fixed) seed; ``progress``
    gets a line (with an ETA) after each round of the dialogues.
    Truncated replies are handled as in training (``end_on_truncation``). ``sharing`` (from
    :func:`scope.panels.run_sharing`) records what each member shares with the run's training simulators.

    Per partner: the mean reward, its standard error and its 95% Wilson interval (``lo``, ``hi``); per
    group (seen, unseen, panel): the mean of its partners' means with a 95% bootstrap interval over the
    tasks, every partner resampled with the same tasks (``scope.stats``), and that bootstrap's s.e."""
    from .stats import cells_of, task_bootstrap, wilson

    seed = panel.seed if seed is None else seed
    agent = Binding(id=agent.id, ref=agent.ref, vs=agent.vs, note=agent.note,
                    sampling=SamplingParams(temperature=panel.temperature, top_p=agent.sampling.top_p,
                                            max_new_tokens=agent.sampling.max_new_tokens, stop=agent.sampling.stop))
    # e.g. tau2 trained on simulated tools: evaluated on the exact ones
    env = env.model_copy(update={"options": get_env(env.name).eval_options(env.options)})
    jobs, owner = panel_jobs(agent, panel, refs, env, split, seed)
    used = [agent.ref] + [j.bindings["partner"].ref for j in jobs] + ([judge.ref] if judge else [])
    with fixed_sampling(used, seed):
        if panel.paired:
            episodes = _paired(jobs, owner, panel, max_context, end_on_truncation, judge, progress)
        else:
            episodes, _ = run_rollouts(jobs, max_context=max_context, end_on_truncation=end_on_truncation,
                                       judge=judge, progress=progress)
    per: dict[str, dict[str, Any]] = {}
    for p in panel.partners:
        eps = [e for e, o in zip(episodes, owner) if o is p]
        ok = [e.rewards.get("agent", 0.0) for e in eps if not e.failed]
        m = sum(ok) / len(ok) if ok else float("nan")
        sd = math.sqrt(sum((x - m) ** 2 for x in ok) / (len(ok) - 1)) if len(ok) > 1 else float("nan")
        lo, hi = wilson(m, len(ok))
        per[p.spec_id()] = {"mean": m, "n": len(ok), "failed": len(eps) - len(ok), "seen": p.seen, "control": p.control,
                            "se": sd / math.sqrt(len(ok)) if len(ok) > 1 else float("nan"), "lo": lo, "hi": hi,
                            "truncated": sum(e.status == "truncated" for e in eps)}
        if sharing and p.spec_id() in sharing:
            sh = sharing[p.spec_id()]
            per[p.spec_id()].update(shares=sh.shared(), family=sh.family_name, training_family=sh.family)
    out = summarize(per)
    summaries = [e.summary() for e in episodes]
    cells = cells_of(summaries)
    for key, sel in GROUPS.items():
        ids = [k for k, v in per.items() if sel(v)]
        if ids:
            b = task_bootstrap([cells], ids)
            out[f"{key}_lo"], out[f"{key}_hi"] = b["lo"], b["hi"]
            if not math.isnan(b["se"]):
                out[f"{key}_se"] = b["se"]
    return out | {"episodes": summaries}


def _paired(jobs: list[Job], owner: list[PanelEntry], panel: Panel, max_context: int, end_on_truncation: bool,
            judge: Binding | None, progress: Callable[[str], None] | None = None) -> list[Episode]:
    """Paired evaluation: the first partner's episodes are played by the agent; every other partner's episode
    of the same (task, copy) replays that agent turn verbatim."""
    first = [i for i, o in enumerate(owner) if o is panel.partners[0]]
    played, _ = run_rollouts([jobs[i] for i in first], max_context=max_context, end_on_truncation=end_on_truncation,
                             judge=judge, progress=progress and (lambda s: progress(f"agent's turns, {s}")))
    turns: dict[tuple[str, int], list[str]] = {}
    for e in played:
        said = [m["content"] for m in e.messages if m["role"] == "agent"]
        if len(said) > 1:
            raise ConfigError(f"panel paired: the agent spoke {len(said)} times in {e.task_id}; paired "
                              "evaluation needs an environment where the agent speaks once (its turn cannot depend "
                              "on the partner)")
        turns[(e.task_id, e.copy)] = said
    rest = [i for i in range(len(jobs)) if i not in set(first)]
    for i in rest:
        j = jobs[i]
        said = turns.get((j.episode.task_id, j.episode.copy), [])
        j.bindings = dict(j.bindings, agent=Binding("replay", ReplayRef(said), j.bindings["agent"].sampling))
    replayed, _ = run_rollouts([jobs[i] for i in rest], max_context=max_context, end_on_truncation=end_on_truncation,
                               judge=judge, progress=progress and (lambda s: progress(f"the panel's replies, {s}")))
    out: list[Episode | None] = [None] * len(jobs)
    for i, e in zip(first, played):
        out[i] = e
    for i, e in zip(rest, replayed):
        e.meta["replayed_agent"] = True
        out[i] = e
    return [e for e in out if e is not None]


GROUPS = {"panel": lambda v: not v.get("control"), "seen": lambda v: v["seen"] and not v.get("control"),
          "unseen": lambda v: not v["seen"] and not v.get("control"), "control": lambda v: bool(v.get("control")),
          "unseen_same_family": lambda v: not v["seen"] and not v.get("control") and v.get("training_family") is True,
          "unseen_other_family": lambda v: not v["seen"] and not v.get("control") and v.get("training_family") is False}
"""The panel's groups: seen, unseen, both (``panel``), the evaluation-only controls apart, and the unseen members
of a training simulator's model family and of another (where the evaluation knows the training simulators)."""
OPTIONAL = ("control", "unseen_same_family", "unseen_other_family")
"""Groups reported only where the panel has members in them."""


def _mean_population_sd(xs: list[float]) -> tuple[float, float]:
    """The mean and the population standard deviation (n) of the values that are not NaN: the spread of a panel's
    members' means (``panel_std``), which are the whole population of the panel."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _se_of_mean(ses: list[float]) -> float:
    """Standard error of a mean of independent partner means, from their own standard errors."""
    ses = [x for x in ses if not math.isnan(x)]
    return math.sqrt(sum(x * x for x in ses)) / len(ses) if ses else float("nan")


def summarize(per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Panel mean and std across partners; seen and unseen means; each mean's standard error (the
    evaluation noise, from the episodes' spread)."""
    means = [v["mean"] for v in per.values() if not v.get("control")]
    m, s = _mean_population_sd(means)
    out = {"per_partner": per, "panel_mean": m, "panel_std": s}
    for key, sel in GROUPS.items():
        vs = [v for v in per.values() if sel(v)]
        if key in OPTIONAL and not vs:
            continue
        if key != "panel":
            out[f"{key}_mean"] = _mean_population_sd([v["mean"] for v in vs])[0]
        out[f"{key}_se"] = _se_of_mean([v.get("se", float("nan")) for v in vs])
    return out


def family_marked(per: dict[str, dict[str, Any]]) -> set[str]:
    """The unseen members to mark with ``SAME_FAMILY_MARK``: all of them, when every one is of a training
    simulator's model family (none otherwise)."""
    unseen = {k: v for k, v in per.items() if not v["seen"] and not v.get("control")}
    if unseen and all(v.get("training_family") is True for v in unseen.values()):
        return set(unseen)
    return set()


def markdown(res: dict[str, Any], title: str = "evaluation") -> str:
    from .panels import SAME_FAMILY_MARK, SAME_WEIGHTS_MARK
    from .stats import fmt as f

    iv = lambda r, k: f"[{f(r.get(k + 'lo'))}, {f(r.get(k + 'hi'))}]"  # noqa: E731
    lines = [f"### {title}", "", "| partner | seen | family | mean reward | 95% interval (Wilson) | ± s.e. | "
             "episodes | failed | truncated | shares with the training simulators |", "|---" * 10 + "|"]
    marked, fam_marked = False, family_marked(res["per_partner"])
    for pid, v in res["per_partner"].items():
        same = "weights" in v.get("shares", [])
        marked |= same and not v["seen"]
        group = "control" if v.get("control") else "yes" if v["seen"] else "no"
        mark = (SAME_WEIGHTS_MARK if same and not v["seen"] else "") + (SAME_FAMILY_MARK if pid in fam_marked else "")
        lines.append(f"| {pid}{mark} | {group} | {v.get('family', 'n/a')} | "
                     f"{f(v['mean'])} | {iv(v, '')} | {f(v.get('se'))} | {v['n']} | {v['failed']} | "
                     f"{v.get('truncated', 0)} | {', '.join(v.get('shares', [])) or 'n/a'} |")
    lines += ["", f"panel mean {f(res['panel_mean'])} ± {f(res['panel_std'])} (std across partners), 95% interval "
                  f"{iv(res, 'panel_')}; seen {f(res['seen_mean'])} {iv(res, 'seen_')}; unseen "
                  f"{f(res['unseen_mean'])} {iv(res, 'unseen_')}"
                  + (f"; unseen of a training family {f(res['unseen_same_family_mean'])} "
                     f"{iv(res, 'unseen_same_family_')}" if "unseen_same_family_mean" in res else "")
                  + (f"; unseen of another family {f(res['unseen_other_family_mean'])} "
                     f"{iv(res, 'unseen_other_family_')}" if "unseen_other_family_mean" in res else "")
                  + (f"; controls (evaluation only, not in the panel mean) {f(res['control_mean'])} "
                     f"{iv(res, 'control_')}" if "control_mean" in res else "")
                  + " (group intervals: bootstrap over the tasks, the same resample for every partner)"]
    if marked:
        lines += ["", f"{SAME_WEIGHTS_MARK}: an unseen partner that runs on a training simulator's weights (the rest "
                      "of its row says what else it shares)."]
    if fam_marked:
        lines += ["", f"{SAME_FAMILY_MARK}: every unseen partner is of a training simulator's model family: the unseen "
                      "reward cannot tell an exploit that the family shares from a gain."]
    return "\n".join(lines + [""])


def write_results(res: dict[str, Any], out_dir: str, title: str = "evaluation") -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "eval.json"), "w") as fh:
        json.dump({k: v for k, v in res.items() if k != "episodes"}, fh, indent=1)
    with open(os.path.join(out_dir, "eval_episodes.jsonl"), "w") as fh:
        for e in res.get("episodes", []):
            fh.write(json.dumps(e, ensure_ascii=False) + "\n")
    with open(os.path.join(out_dir, "eval.md"), "w") as fh:
        fh.write(markdown(res, title))


# ---- diagnosis of a partner -----------------------------------------------------------------------
class ReplayRef:
    """An agent that repeats the turns of a recorded dialogue, in order (for nested resampling)."""

    chat, trainable, version = True, False, 0

    def __init__(self, turns: list[str]):
        self.turns, self.i, self.id = turns, 0, "replay"

    def drop_sessions(self, keys) -> None:
        pass

    def chat_generate(self, convs, sampling, response_format=None):
        out = []
        for _ in convs:
            if self.i >= len(self.turns):
                out.append(RuntimeError("replayed dialogue has no more agent turns"))
                continue
            out.append(Completion(self.turns[self.i], [], [], "eos", model_id="replay"))
            self.i += 1
        return out


class ProbeStates:
    """A fixed set of dialogue states at which the partner's behaviour is measured at every checkpoint.

    Modal mass over the states that rollouts happen to share moves with the agent's own collapse (a
    collapsed agent visits few states, all of them often). Here the states are fixed once, at the first
    training step: the first agent turn of the first rollout of each of ``n`` task groups (the untrained
    policy's openings), saved in the run directory. At each measurement the partner answers each state
    ``samples`` times (the agent's turn replayed), and the modal mass is the mean, over the states, of the
    share of the most frequent behaviour class among those answers."""

    def __init__(self, states: list[dict[str, str]]):
        self.states = states

    @classmethod
    def from_episodes(cls, episodes: list[Episode], n: int) -> "ProbeStates":
        states, groups = [], set()
        for e in episodes:
            if e.failed or e.group_id in groups:
                continue
            turn = next((m["content"] for m in e.messages if m["role"] == "agent"), None)
            if turn is not None:
                groups.add(e.group_id)
                states.append({"task_id": e.task_id, "agent_turn": turn})
            if len(states) >= n:
                break
        return cls(states)

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.states, f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> "ProbeStates":
        with open(path) as f:
            return cls(json.load(f))

    def measure(self, tasks: dict[str, Any], partners: list[Binding], agent_sampling: SamplingParams,
                env_name: str, env_options: dict, samples: int, classify, seed: int,
                max_context: int = 4096) -> dict[str, float]:
        """The partner's modal mass at the fixed states; ``partners`` are cycled over the samples (a rotation
        or persona source's bindings of this step, so a mixture is measured as the agent meets it)."""
        env_cls = get_env(env_name)
        rng = random.Random(seed)  # the env as in training; each dialogue ends at the agent's second turn,
        # right after the partner's answer to its first, the one reply measured
        plays, owner = [], []
        for k, st in enumerate(self.states):
            if st["task_id"] not in tasks:
                continue
            for j in range(samples):
                plays.append(Play(tasks[st["task_id"]], Episode(st["task_id"], f"probe:{k}", j),
                                  {"agent": Binding("replay", ReplayRef([st["agent_turn"]]), agent_sampling),
                                   "partner": partners[(k * samples + j) % len(partners)]},
                                  stop_after={"agent": 1}))
                owner.append(k)
        jobs = make_jobs(env_cls, plays, env_options, rng, "probe")
        if not jobs:
            return {}
        with fixed_sampling([p.ref for p in partners], seed):  # neither depends on nor disturbs training's noise
            eps, _ = run_rollouts(jobs, max_context=max_context, end_on_truncation=False)
        classes: dict[int, list[str]] = {}
        for e, k in zip(eps, owner):
            reply = next((m["content"] for m in e.messages if m["role"] == "partner"), None)
            if reply is not None:
                classes.setdefault(k, []).append(classify(reply))
        masses = [max(cs.count(c) for c in set(cs)) / len(cs) for cs in classes.values() if len(cs) >= 2]
        return {"modal_mass": sum(masses) / len(masses), "probe_states": float(len(masses))} if masses else {}


def nested_variance(episodes: list[Episode], tasks: dict[str, Any], agent_sampling: SamplingParams,
                    partner_of, env_name: str, env_options: dict, resamples: int, rng: random.Random,
                    max_context: int = 4096, classify=None, end_on_truncation: bool = True) -> dict[str, float]:
    """Split the reward variance into partner and agent parts by nested resampling, within each task.

    Each given dialogue's agent turns are replayed verbatim against ``resamples`` fresh samples of its
    partner (``partner_of(episode)`` gives the binding). Per task, partner part = E[Var(R | agent turns)]
    and agent part = Var(E[R | agent turns]) over that task's dialogues, then averaged over tasks, so give
    several dialogues per task. Truncated replies end a replay as they end a training rollout
    (``end_on_truncation``). With ``classify``, also the partner's behaviour modal mass over the
    resamples (which meet the same dialogue state at least at their first partner turn).
    """
    env_cls = get_env(env_name)
    takes_turns = "max_turns" in inspect.signature(env_cls.__init__).parameters
    nested, owners = [], []
    for k, e in enumerate(episodes):
        turns = [m["content"] for m in e.messages if m["role"] == "agent"]
        if not turns:
            continue
        # an env with a turn limit ends the replay with the original's last agent turn; elsewhere a
        # replay that runs out of turns ends ungraded ("replay_end") and is left out
        opts = dict(env_options, max_turns=len(turns)) if takes_turns else dict(env_options)
        for j in range(resamples):
            nested.append(Play(tasks[e.task_id], Episode(e.task_id, f"nest:{k}", j),
                               {"agent": Binding("replay", ReplayRef(turns), agent_sampling), "partner": partner_of(e)},
                               options=opts, stop_after={"agent": len(turns)}))
            owners.append(k)
    eps, _ = run_rollouts(make_jobs(env_cls, nested, env_options, rng, "decompose"), max_context=max_context,
                          end_on_truncation=end_on_truncation)
    rows: dict[int, list[float]] = {}
    for e, k in zip(eps, owners):
        if e.status not in ("failed", "replay_end"):
            rows.setdefault(k, []).append(e.rewards.get("agent", 0.0))
    by_task: dict[str, list[list[float]]] = {}
    for k, r in rows.items():
        by_task.setdefault(episodes[k].task_id, []).append(r)
    out = variance_decomposition(by_task)
    if classify is not None:
        mm = behaviour_stats(eps, classify).get("modal_mass")
        if mm is not None:
            out["modal_mass"] = mm
    return out


def diagnose(agent: Binding, partner: Binding, env: EnvConfig, split: str,
             n_tasks: int = 4, group: int = 8, resamples: int = 4, seed: int = 0,
             end_on_truncation: bool = True) -> dict[str, Any]:
    """Partner collapse without training: behaviour classes and similarity over G rollouts per task, the
    variance decomposition from ``resamples`` partner replays per first-stage rollout, and the partner's
    modal mass where those replays meet the same dialogue state."""
    env_name, env_options, env_cls = env.name, env.options, get_env(env.name)
    tasks = load_tasks(env, split)[:n_tasks]
    rng = random.Random(seed)
    plays = [Play(task, Episode(task.id, f"diag:{ti}", g), {"agent": agent, "partner": partner})
             for ti, task in enumerate(tasks) for g in range(group)]
    first, _ = run_rollouts(make_jobs(env_cls, plays, env_options, rng, "diagnose"),
                            end_on_truncation=end_on_truncation)
    classify = classifier_of(env_name) or (lambda t: "other")
    out: dict[str, Any] = {"behaviour": behaviour_stats(first, classify),
                           "partner_similarity": group_similarity(first, "partner"),
                           "agent_similarity": group_similarity(first, "agent")}
    base = [e for e in first if not e.failed]
    out["variance"] = nested_variance(base, {e.task_id: t for e in base for t in tasks if t.id == e.task_id},
                                      agent.sampling, lambda e: partner, env_name, env_options, resamples, rng,
                                      classify=classify, end_on_truncation=end_on_truncation)
    if "modal_mass" in out["variance"]:  # at the replayed states, where every resample meets the same history
        out["modal_mass"] = out["variance"].pop("modal_mass")
    out["first_stage_reward_mean"] = sum(e.rewards.get("agent", 0.0) for e in base) / max(len(base), 1)
    return out
