"""``scope personas evolve``: MAP-Elites over persona generators, with fitness from played dialogues.

One generation: draw parents from the archive's elites, vary them (``mutate.py``), expand every child
into a population of personas, let the simulator play each persona against the agent in the
environment (all children's dialogues in one batched rollout), gate each persona on task integrity,
score the child (human-likeness and coverage, ``fitness.py``) and place it in the archive cell of its
behaviour descriptors (the population's mean of two fingerprint features, binned) if the cell is empty
or it beats the elite there. After every generation the archive, the random state and the classifier
are written atomically to ``RUN_DIR/state.json`` and the best generator's population to
``RUN_DIR/personas.json`` (the file ``partner.source: persona`` reads); ``--resume RUN_DIR`` continues.
"""
from __future__ import annotations

import json
import os
import random
import time
from typing import Any, Callable

import numpy as np
import yaml

from ..config import ConfigError
from ..run import eta
from .config import PersonaSearchConfig
from .features import FEATURES, fingerprint, load_p4g_humans, turn_features
from .fitness import HumanLikeness, Standardizer, auc, density_coverage, p4g_integrity, tau2_integrity
from .genome import Genome, domain_of, seed_genomes
from .program import ProgramFailure, ProgramGenome


class Evaluator:
    """Plays personas in the environment and scores what their simulator says."""

    def __init__(self, cfg: PersonaSearchConfig, refs: dict[str, Any] | None = None, classifier_state=None,
                 log: Callable[[str], None] = print, split: str = "train"):
        from ..envs.base import get_env
        from ..models.loading import frozen_refs
        from ..partners.binding import spec_binding

        self.cfg, self.log = cfg, log
        self.env_name = cfg.env.get("name", "p4g")
        self.env_cls = get_env(self.env_name)
        self.options = dict(cfg.env.get("options") or {})
        unknown = sorted(set(self.options) - self.env_cls.option_names())
        if unknown:
            raise ConfigError(f"env.options: unknown options {unknown} of {self.env_name}")
        try:
            self.options = self.env_cls.check_options(self.options)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.env_name == "p4g":
            self.options.setdefault("max_turns", 3)
        else:
            self.options.setdefault("max_steps", 8)
        self.tasks = self.env_cls.load_tasks(split, **self.options)  # whose personas the simulator plays
        refs = refs if refs is not None else frozen_refs(cfg.models, {}, cfg.seed)
        self.agent = spec_binding(cfg.agent, refs[cfg.agent.model])
        self.sim = spec_binding(cfg.simulator, refs[cfg.simulator.model])
        self.mutator_binding = spec_binding(cfg.mutator, refs[cfg.mutator.model]) if cfg.mutator else None
        self.expander = spec_binding(cfg.expander, refs[cfg.expander.model]) if cfg.expander else None
        self.expand_stats: dict[str, int] = {}
        if cfg.humans.traces:
            h = load_traces(cfg.humans.traces)
        else:
            data_dir = cfg.humans.data_dir or os.environ.get("SCOPE_P4G_DATA")
            if not data_dir:
                raise ConfigError("humans.data_dir: set it (or SCOPE_P4G_DATA) to the P4G data directory")
            h = load_p4g_humans(data_dir, cfg.humans.test_fraction, cfg.humans.split_seed)
        # people's dialogues cut to as many user turns as a simulated one has (tau2: about half its steps)
        t = self.options.get("max_turns") or max(1, self.options.get("max_steps", 8) // 2)
        self.human_train = [d[:t] for d in h["train"]]
        test = [d[:t] for d in h["test"]]
        rng = random.Random(cfg.humans.split_seed)
        rng.shuffle(test)
        n_cmp = min(cfg.humans.comparison, len(test) // 3)
        self.human_comparison, self.human_reference = test[:n_cmp], test[n_cmp:]
        ref_fp = np.array([fingerprint(d) for d in self.human_reference])
        self.scale = Standardizer(ref_fp)
        self.reference = self.scale(ref_fp)
        if classifier_state is not None:
            self.classifier = HumanLikeness.from_state(classifier_state["model"])
            self.classifier_auc = classifier_state["auc"]
        else:
            self._train_classifier()

    def _train_classifier(self) -> None:
        n = self.cfg.search.calibration_dialogues
        self.log(f"human-likeness: playing {n} dialogues of the default simulator (no persona)")
        eps = self.play([[{"id": "default", "text": ""}]] * n, seed=self.cfg.seed + 99, per=1)
        sim_dialogues = [self.partner_turns(e[0][0]) for e in eps if e[0] and e[0][0] is not None]
        cut = int(len(sim_dialogues) * 0.8)
        human_turns = [t for d in self.human_train for t in d]
        sim_train = [t for d in sim_dialogues[:cut] for t in d]
        sim_test = [t for d in sim_dialogues[cut:] for t in d]
        if not sim_train or not sim_test:
            raise RuntimeError("human-likeness: the default simulator produced no turns to train on")
        feats = lambda ts: np.array([turn_features(x) for x in ts])  # noqa: E731
        self.classifier = HumanLikeness().fit(feats(human_turns), feats(sim_train))
        held_h = [t for d in self.human_reference for t in d]
        self.classifier_auc = auc(self.classifier.prob(feats(held_h)), self.classifier.prob(feats(sim_test)))
        self.log(f"human-likeness classifier: held-out AUC {self.classifier_auc:.3f} "
                 f"({len(held_h)} held-out human turns vs {len(sim_test)} default-simulator turns)")

    def classifier_state(self) -> dict[str, Any]:
        return {"model": self.classifier.state(), "auc": self.classifier_auc}

    def expand(self, genome, n: int, rng: random.Random) -> list[dict[str, Any]]:
        """A generator's population: a structured genome draws it here; a program runs in the sandbox, each
        persona written for the task it will be played on (its ``task_id``)."""
        if isinstance(genome, ProgramGenome):
            tasks = [self.tasks[rng.randrange(len(self.tasks))] for _ in range(n)]
            pop = genome.expand(n, rng, tasks=[t.data for t in tasks])
            for p, t in zip(pop, tasks):
                p["task_id"] = t.id
            return pop
        return genome.expand(n, rng)

    def integrity(self, ep) -> str | None:
        """Why a dialogue shows the persona broke the task (None: it did not): P4G, the persuadee stayed one and
        used the marker; tau2, every required fact the agent asked for was said (``fitness``)."""
        if self.env_name == "p4g":
            return p4g_integrity(self.partner_turns(ep))
        task = next(t for t in self.tasks if t.id == ep.task_id).data["task"]
        return tau2_integrity(ep.messages, task)

    @staticmethod
    def partner_turns(ep) -> list[str]:
        return [m["content"] for m in ep.messages if m["role"] == "partner"]

    def play(self, populations: list[list[dict[str, Any]]], seed: int, per: int | None = None
             ) -> list[list[list[Any]]]:
        """Every persona of every population plays ``dialogues_per_persona`` dialogues (in one batched
        rollout). Returns, per population, per persona, its episodes (None where one failed)."""
        from ..rollout import Play, make_jobs, run_rollouts
        from ..types import Episode

        rng = random.Random(seed)
        plays, where = [], []
        per = per or self.cfg.search.dialogues_per_persona
        for gi, pop in enumerate(populations):
            for pi, persona in enumerate(pop):
                b = self.sim.with_persona(persona["text"].strip(), id=f"sim/{persona['id']}")
                for c in range(per):
                    task = self.tasks[rng.randrange(len(self.tasks))]
                    if persona.get("task_id"):  # written for this task
                        task = next(t for t in self.tasks if t.id == persona["task_id"])
                    plays.append(Play(task, Episode(task_id=task.id, group_id=f"{gi}/{pi}", copy=c),
                                      {"agent": self.agent, "partner": b}, env_seed=rng.random()))
                    where.append((gi, pi))
        jobs = make_jobs(self.env_cls, plays, self.options, rng, "personas")  # every env seed drawn above
        episodes, _ = run_rollouts(jobs, max_context=self.cfg.max_context, end_on_truncation=False)
        out: list[list[list[Any]]] = [[[] for _ in pop] for pop in populations]
        for (gi, pi), ep in zip(where, episodes):
            out[gi][pi].append(None if ep.failed else ep)
        return out

    def score_dialogues(self, dialogues: list[list[str]]) -> dict[str, Any]:
        """Human-likeness, coverage and density of dialogues (each: one side's turns)."""
        turns = [t for d in dialogues for t in d]
        fp = np.array([fingerprint(d) for d in dialogues]) if dialogues else np.zeros((0, len(FEATURES)))
        dc = density_coverage(self.reference, self.scale(fp), self.cfg.search.k) if len(fp) else \
            {"density": float("nan"), "coverage": 0.0}
        mean = fp.mean(0) if len(fp) else np.full(len(FEATURES), np.nan)
        return {"human": self.classifier.score(turns), "coverage": dc["coverage"], "density": dc["density"],
                "n_dialogues": len(dialogues), "fingerprint": dict(zip(FEATURES, [float(x) for x in mean]))}

    def score_population(self, personas: list[dict[str, Any]], episodes: list[list[Any]]) -> dict[str, Any]:
        """Gate each persona on task integrity, then score the accepted ones' dialogues together."""
        s = self.cfg.search
        accepted, rejected = [], {}
        for p, eps in zip(personas, episodes):
            eps = [e for e in eps if e is not None]
            reason = None if eps else "every dialogue failed"
            for e in eps:
                reason = reason or self.integrity(e)
            if reason:
                rejected[p["id"]] = reason
            else:
                accepted.append((p, [self.partner_turns(e) for e in eps]))
        m = self.score_dialogues([d for _, ds in accepted for d in ds])
        m["personas"] = len(personas)
        m["rejected"] = rejected
        m["reject_frac"] = len(rejected) / max(1, len(personas))
        m["status"] = "rejected" if m["reject_frac"] > s.max_reject or not accepted else "ok"
        hum = 0.0 if np.isnan(m["human"]) else m["human"]
        m["fitness"] = (s.human_weight * hum + s.coverage_weight * m["coverage"] if m["status"] == "ok"
                        else float("-inf"))
        m["descriptors"] = [m["fingerprint"][d] for d in s.descriptors]
        m["accepted_ids"] = [p["id"] for p, _ in accepted]
        return m


def genome_from_dict(d: dict[str, Any]):
    return ProgramGenome.from_dict(d) if d.get("kind") == "program" else Genome.from_dict(d)


def seed_children(n: int, kind: str, rng: random.Random, env_name: str = "p4g") -> list:
    """Generation 0: structured genomes from the domain's axis library (P4G persuadees or tau2 customers), as
    programs too when asked (``search.genome``)."""
    gs = seed_genomes(n, rng, domain=domain_of(env_name))
    if kind == "program":
        return [ProgramGenome.from_genome(g) for g in gs]
    if kind == "both":
        return [ProgramGenome.from_genome(g) if i % 2 else g for i, g in enumerate(gs)]
    return gs


class ProgramMutator:
    """Program children: with a model and probability ``rewrite_prob``, the model's rewrite of the parent
    (``program.REWRITE_PROMPT``; a reply without a usable program falls back); otherwise a structural change
    of the parent's DATA (``program.mutate_program``)."""

    def __init__(self, binding: Any, rewrite_prob: float = 0.5):
        self.binding, self.rewrite_prob = binding, rewrite_prob
        self.stats = {"structural": 0, "rewrites": 0, "unusable": 0}

    def __call__(self, pairs: list, rng: random.Random) -> list:
        from ..rollout import chat_complete
        from .program import REWRITE_PROMPT, extract_program, mutate_program

        out: list = []
        asks = []
        for p, o in pairs:
            if self.binding is not None and rng.random() < self.rewrite_prob:
                asks.append((len(out), p))
            out.append(mutate_program(p, rng, o))
            self.stats["structural"] += 1
        if asks:
            convs = [[{"role": "user", "content": REWRITE_PROMPT.format(source=p.source)}] for _, p in asks]
            for (i, p), c in zip(asks, chat_complete(self.binding.ref, convs, self.binding.sampling)):
                src = None if isinstance(c, BaseException) else extract_program(c.text)
                if src is None:
                    self.stats["unusable"] += 1
                    continue
                out[i] = ProgramGenome(src, parents=[p.id], ops=["rewrite"])
                self.stats["rewrites"] += 1
                self.stats["structural"] -= 1
        return out


def load_traces(path: str, every: int = 5) -> dict[str, list[list[str]]]:
    """Human dialogues of your own (``humans.traces``, see HumansConfig): {"train": [...], "test": [...]}."""
    if not os.path.exists(path):
        raise ConfigError(f"humans.traces: {path} not found")
    out: dict[str, list[list[str]]] = {"train": [], "test": []}
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                raise ConfigError(f"humans.traces: line {i + 1} of {path} is not JSON") from None
            turns = d.get("user_turns") if isinstance(d, dict) else None
            if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns) or not turns:
                raise ConfigError(f"humans.traces: line {i + 1} of {path} has no user_turns list of texts")
            side = d.get("split") or ("test" if i % every == every - 1 else "train")
            out["test" if side == "test" else "train"].append(turns)
    if len(out["train"]) < 4 or len(out["test"]) < 8:
        raise ConfigError(f"humans.traces: {path} holds too few dialogues (train {len(out['train'])}, "
                          f"test {len(out['test'])}; need 4 and 8 or more)")
    return out


def cell_of(desc: list[float], bins: int) -> str:
    return ",".join(str(min(bins - 1, max(0, int(x * bins)))) if x == x else "nan" for x in desc)


# ---- the search ---------------------------------------------------------------------------------------
def evolve(cfg: PersonaSearchConfig, resume: bool = False, log: Callable[[str], None] = print,
           refs: dict[str, Any] | None = None, mutator=None) -> dict[str, Any]:
    from ..run import write_atomic
    from .mutate import ModelMutator, StructuralMutator

    d = cfg.run_dir
    state_path = os.path.join(d, "state.json")
    if os.path.exists(state_path) and not resume:
        raise ConfigError(f"{d} holds a persona search already: continue it with --resume {d}, or set run.dir")
    os.makedirs(d, exist_ok=True)
    cfg_text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    if resume:
        with open(state_path) as f:
            state = json.load(f)
        log(f"resuming {d} at generation {state['generation'] + 1} ({len(state['archive'])} elites)")
    else:
        state = {"generation": -1, "archive": {}, "history": [], "rng": None, "classifier": None, "rejected": 0}
        write_atomic(os.path.join(d, "config.yaml"), cfg_text)
    ev = Evaluator(cfg, refs=refs, classifier_state=state["classifier"], log=log)
    state["classifier"] = ev.classifier_state()
    rng = random.Random(cfg.seed)
    if state["rng"] is not None:
        rng.setstate((state["rng"][0], tuple(state["rng"][1]), state["rng"][2]))
    if mutator is None:
        mutator = ModelMutator(ev.mutator_binding, cfg.rewrite_prob) if ev.mutator_binding else StructuralMutator()
    s = cfg.search
    program_mutator = ProgramMutator(ev.mutator_binding, s.program_rewrite_prob)
    state.setdefault("program_failures", [])
    t_loop, first = time.time(), state["generation"] + 1
    while state["generation"] + 1 <= s.generations:
        gen = state["generation"] + 1
        t0 = time.time()
        elites = [genome_from_dict(e["genome"]) for e in state["archive"].values()]
        if gen == 0 or not elites:
            children = seed_children(s.seeds, s.genome, rng, cfg.env.get("name", "p4g"))
        else:
            pairs = [(rng.choice(elites), rng.choice(elites) if len(elites) > 1 else None) for _ in range(s.children)]
            structured = [(p, o if isinstance(o, Genome) else None) for p, o in pairs if isinstance(p, Genome)]
            programs = [(p, o) for p, o in pairs if isinstance(p, ProgramGenome)]
            children = (mutator(structured, rng) if structured else []) + program_mutator(programs, rng)
        pops, failed = [], {}
        for c in children:
            try:
                pops.append(ev.expand(c, s.population, random.Random(rng.random())))
            except ProgramFailure as e:  # a program that fails, loops or escapes: scored 0, counted
                failed[c.id] = str(e)
                pops.append([])
        if failed:
            state["program_failures"] += [{"generation": gen, "id": k, "reason": v} for k, v in failed.items()]
            log(f"generation {gen}: {len(failed)} program(s) failed in the sandbox: "
                + "; ".join(f"{k}: {v[:80]}" for k, v in failed.items()))
        if ev.expander is not None:
            from .mutate import expand_with_model

            flat = expand_with_model([p for pop in pops for p in pop], ev.expander, ev.expand_stats)
            sizes, at = [len(pop) for pop in pops], 0
            pops = []
            for n in sizes:  # (a failed program's population is empty)
                pops.append(flat[at:at + n])
                at += n
        episodes = ev.play(pops, seed=rng.randrange(2 ** 31))
        placed = 0
        for c, pop, eps in zip(children, pops, episodes):
            if c.id in failed:
                continue
            m = ev.score_population(pop, eps)
            if m["status"] != "ok":
                state["rejected"] += 1
                continue
            key = cell_of(m["descriptors"], s.bins)
            old = state["archive"].get(key)
            if old is None or m["fitness"] > old["metrics"]["fitness"]:
                state["archive"][key] = {"genome": c.to_dict(), "metrics": m, "generation": gen,
                                         "personas": [{"id": p["id"], "text": p["text"], "axes": p["axes"]}
                                                      for p in pop if p["id"] in m["accepted_ids"]]}
                placed += 1
        best = max(state["archive"].values(), key=lambda e: e["metrics"]["fitness"], default=None)
        row = {"generation": gen, "children": len(children), "placed": placed, "elites": len(state["archive"]),
               "programs": sum(isinstance(c, ProgramGenome) for c in children), "program_failures": len(failed),
               "seconds": round(time.time() - t0, 1),
               "best_fitness": best["metrics"]["fitness"] if best else None,
               "best_human": best["metrics"]["human"] if best else None,
               "best_coverage": best["metrics"]["coverage"] if best else None,
               "mutator": dict(getattr(mutator, "stats", {})), "expander": dict(ev.expand_stats)}
        state["history"].append(row)
        state["generation"] = gen
        st = rng.getstate()
        state["rng"] = [st[0], list(st[1]), st[2]]
        write_atomic(state_path, json.dumps(state))
        if best:
            write_atomic(os.path.join(d, "personas.json"), json.dumps(output(best, ev, cfg), indent=1))
        log(f"generation {gen}/{s.generations}: {len(children)} generators, {placed} placed, archive "
            f"{len(state['archive'])} cells" + (f", best fitness {best['metrics']['fitness']:.3f} (human-likeness "
                                               f"{best['metrics']['human']:.3f}, coverage "
                                               f"{best['metrics']['coverage']:.3f})" if best else "")
            + f", {row['seconds']:.0f} s ({eta(time.time() - t_loop, gen - first + 1, s.generations - gen)})")
    return state


def output(elite: dict[str, Any], ev: Evaluator, cfg: PersonaSearchConfig) -> dict[str, Any]:
    """The persona file: the personas (``partner.source: persona`` reads ``personas``), the generator that
    made them and its fitness."""
    m = elite["metrics"]
    return {"personas": [{"id": p["id"], "text": p["text"]} for p in elite["personas"]],
            "generator": elite["genome"],
            "fitness": {k: m[k] for k in ("fitness", "human", "coverage", "density", "reject_frac", "n_dialogues")},
            "classifier_auc": ev.classifier_auc, "generation": elite["generation"],
            "made_by": "scope personas evolve", "simulator": cfg.simulator.model,
            "models": {k: v.path for k, v in cfg.models.items()}}


def score_sets(cfg: PersonaSearchConfig, specs: list[str], dialogues: int = 32, seed: int = 1,
               run_dir: str | None = None, log: Callable[[str], None] = print,
               refs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Fitness of persona sets (a persona file, ``builtin``, ...) and of real held-out humans, each on
    ``dialogues`` dialogues, with one classifier and one human reference (``run_dir``'s, if given)."""
    from ..partners.sources import load_personas

    cls_state = None
    if run_dir:
        with open(os.path.join(run_dir, "state.json")) as f:
            cls_state = json.load(f)["classifier"]
    ev = Evaluator(cfg, refs=refs, classifier_state=cls_state, log=log)
    rows = []
    for spec in specs:
        personas = load_personas(spec)
        pop = [{"id": f"{personas[i % len(personas)]['id']}#{i}", "text": personas[i % len(personas)]["text"]}
               for i in range(dialogues)]
        log(f"scoring {spec}: {len(personas)} personas, {dialogues} dialogues")
        m = ev.score_population(pop, ev.play([pop], seed=seed, per=1)[0])
        rows.append({"set": spec, "personas": len(personas)} | {k: m[k] for k in (
            "human", "coverage", "density", "reject_frac", "n_dialogues", "fingerprint")})
    humans = ev.human_comparison[:dialogues]
    m = ev.score_dialogues(humans)
    rows.append({"set": "real held-out P4G humans", "personas": len(humans), "reject_frac": 0.0}
                | {k: m[k] for k in ("human", "coverage", "density", "n_dialogues", "fingerprint")})
    for r in rows:
        r["classifier_auc"] = ev.classifier_auc
    return rows
