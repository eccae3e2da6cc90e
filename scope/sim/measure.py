"""``scope sim measure``: a simulator fitted to people against the base simulator, on the held-out people.

Three measurements, each for the base model and for the fitted adapter, on the test side of the P4G
environment's split (persuadees no fit has seen):

- **perplexity** of the held-out persuadees' own turns (each dialogue as the environment shows it to its
  persuadee; per token of the persuadee's turns, end-of-turn tokens included, as the fit is trained);
- **donations**: the simulator plays each held-out persona against the base persuader (the paper configs'
  setup: 5 persuader turns, play past a $0) and its donations are compared with what those very people
  gave: Wasserstein-1 distance, mean, share of $0, share of dialogues without a marker (counted as $0);
- **human-likeness and coverage** as ``scope personas score`` measures them: a classifier of single turns
  trained on the train persuadees against the base simulator (its held-out AUC is reported), and the
  density/coverage of the dialogues' fingerprints against held-out people's.
"""
from __future__ import annotations

import json
import os
import random
from typing import Any, Callable

import numpy as np

from ..data.p4g import load_dialogues
from .fit import FitConfig, examples, perplexity

PAPER_P4G = {"max_turns": 5, "continue_after_zero": True}


def donation_stats(xs: list[float], humans: list[float]) -> dict[str, float]:
    from scipy.stats import wasserstein_distance

    return {"mean": float(np.mean(xs)), "zero_share": float(np.mean([x == 0 for x in xs])),
            "wasserstein": float(wasserstein_distance(xs, humans)), "n": len(xs)}


def play_donations(agent, sim, tasks, options: dict, seed: int, max_context: int) -> list[float | None]:
    """The donation of each task's persona played by ``sim`` against ``agent`` (None: no marker)."""
    from ..envs.base import get_env
    from ..rollout import Play, make_jobs, run_rollouts
    from ..types import Episode

    plays = [Play(t, Episode(t.id, f"don:{i}", 0), {"agent": agent, "partner": sim}) for i, t in enumerate(tasks)]
    jobs = make_jobs(get_env("p4g"), plays, options, random.Random(seed), "measure")
    eps, _ = run_rollouts(jobs, max_context=max_context, end_on_truncation=False)
    return [None if e.failed else e.meta.get("donation") for e in eps]


def measure(adapter: str, model: str = "smollm2-135m", data_dir: str | None = None, dialogues: int = 64,
            ppl_dialogues: int = 64, persona_config: str = "configs/personas/evolve.yaml", seed: int = 0,
            max_new_tokens: int = 60, temperature: float = 0.7, log: Callable[[str], None] = print) -> dict[str, Any]:
    from ..config import ModelConfig, PartnerSpec
    from ..eval import fixed_sampling
    from ..models.loading import frozen_refs
    from ..envs.base import get_env
    from ..partners.binding import spec_binding
    from ..personas.config import load_search_config
    from ..personas.search import Evaluator

    models = {"base": ModelConfig(path=model), "fitted": ModelConfig(path=model, adapter=adapter)}
    backends: dict = {}
    refs = frozen_refs(models, backends, seed)  # one base in memory, the fitted adapter on it
    backend = refs["base"].backend
    out: dict[str, Any] = {"adapter": adapter, "model": model}

    # perplexity of the held-out people's own turns
    test = load_dialogues(data_dir, "test")
    rng = random.Random(seed)
    sample = rng.sample(test, min(ppl_dialogues, len(test)))
    data = examples(backend.tokenizer, sample, FitConfig().max_tokens)
    out["perplexity"] = {k: perplexity(backend, refs[k].adapter, data, 2048) for k in ("base", "fitted")}
    out["perplexity"]["dialogues"] = len(sample)
    log(f"sim measure: held-out perplexity base {out['perplexity']['base']:.2f}, "
        f"fitted {out['perplexity']['fitted']:.2f} ({len(sample)} dialogues)")

    # donations of held-out personas against the base persuader, and what those people gave
    env_opts: dict[str, Any] = {**PAPER_P4G, "personas": "real"}
    if data_dir:
        env_opts["data_dir"] = data_dir
    tasks = get_env("p4g").load_tasks("test", **env_opts)
    tasks = random.Random(seed + 1).sample(tasks, min(dialogues, len(tasks)))
    humans = [min(max(float(t.data["donation"]), 0.0), 2.0) for t in tasks if t.data.get("donation") is not None]
    spec = PartnerSpec(model="base", temperature=temperature, max_new_tokens=max_new_tokens)
    agent = spec_binding(spec, refs["base"])
    out["donations"] = {"humans": donation_stats(humans, humans) | {"wasserstein": 0.0}}
    for k in ("base", "fitted"):
        sim = spec_binding(PartnerSpec(model=k, temperature=temperature, max_new_tokens=max_new_tokens), refs[k])
        with fixed_sampling([refs["base"]], seed + 2):
            got = play_donations(agent, sim, tasks, env_opts, seed + 3, max_context=4096)
        given = [0.0 if g is None else float(g) for g in got]
        no_marker = float(np.mean([g is None for g in got]))
        out["donations"][k] = donation_stats(given, humans) | {"no_marker_share": no_marker}
        log(f"sim measure: donations {k}: " + ", ".join(f"{a} {b:.3f}" for a, b in out["donations"][k].items()))

    # human-likeness and coverage, as `scope personas score` measures them, on held-out personas
    cfg = load_search_config(persona_config)
    cfg.models = {"policy": ModelConfig(path=model), "fitted": ModelConfig(path=model, adapter=adapter)}
    cfg.env = {"name": "p4g", "options": {**(cfg.env.get("options") or {}), "personas": "real",
                                          **({"data_dir": data_dir} if data_dir else {})}}
    if data_dir:
        cfg.humans.data_dir = data_dir
    prefs = frozen_refs(cfg.models, backends, seed)
    ev = Evaluator(cfg, refs=prefs, log=log, split="test")  # the classifier: train people vs the base simulator
    rows = {}
    for k, sim_model in (("base", "policy"), ("fitted", "fitted")):
        e = ev if k == "base" else Evaluator(cfg.model_copy(update={"simulator": cfg.simulator.model_copy(
            update={"model": sim_model})}), refs=prefs, classifier_state=ev.classifier_state(), log=log, split="test")
        eps = e.play([[{"id": "default", "text": ""}]] * dialogues, seed=seed + 5, per=1)
        ds = [e.partner_turns(x[0][0]) for x in eps if x[0] and x[0][0] is not None]
        rows[k] = {key: e.score_dialogues(ds)[key] for key in ("human", "coverage", "density", "n_dialogues")}
    hum = ev.score_dialogues(ev.human_comparison[:dialogues])
    rows["humans"] = {key: hum[key] for key in ("human", "coverage", "density", "n_dialogues")}
    out["human_likeness"] = rows | {"classifier_auc": ev.classifier_auc}
    log("sim measure: human-likeness " + ", ".join(f"{k} {v['human']:.3f}" for k, v in rows.items()))
    return out


def table(m: dict[str, Any]) -> str:
    p, d, h = m["perplexity"], m["donations"], m["human_likeness"]
    def f(x, n=3):
        return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{n}f}"
    rows = ["| | base SmolLM2 | fitted (scope sim fit) | held-out people |", "|---|---|---|---|",
            f"| perplexity of held-out persuadee turns ({p['dialogues']} dialogues) | {f(p['base'], 2)} | "
            f"{f(p['fitted'], 2)} | |",
            f"| donation: Wasserstein-1 to the people's | {f(d['base']['wasserstein'])} | "
            f"{f(d['fitted']['wasserstein'])} | 0 |",
            f"| donation: mean | ${f(d['base']['mean'], 2)} | ${f(d['fitted']['mean'], 2)} | "
            f"${f(d['humans']['mean'], 2)} |",
            f"| donation: share of $0 | {f(d['base']['zero_share'], 2)} | {f(d['fitted']['zero_share'], 2)} | "
            f"{f(d['humans']['zero_share'], 2)} |",
            f"| no donation marker (counted as $0) | {f(d['base']['no_marker_share'], 2)} | "
            f"{f(d['fitted']['no_marker_share'], 2)} | |",
            f"| human-likeness (classifier, held-out AUC {f(h['classifier_auc'])}) | {f(h['base']['human'])} | "
            f"{f(h['fitted']['human'])} | {f(h['humans']['human'])} |",
            f"| coverage of held-out people | {f(h['base']['coverage'])} | {f(h['fitted']['coverage'])} | "
            f"{f(h['humans']['coverage'])} |"]
    return "\n".join(rows) + "\n"


def write(m: dict[str, Any], out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "measure.json"), "w") as f:
        json.dump(m, f, indent=1, default=float)
    path = os.path.join(out_dir, "measure.md")
    with open(path, "w") as f:
        f.write(table(m))
    return path
