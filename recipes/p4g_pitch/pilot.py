"""P4G-pitch's experiment around the grid: the pilot, the fidelity cards, the positive control and the verdicts
of the pre-registered signatures (``python -m recipes.p4g_pitch pilot | cards | control | verdicts``).

- **Pilot** (before any training run): ~256 pitches sampled from the untrained persuader and ~24 written ones,
  each scored by every simulator (the training simulators of the grid and the panel) on the same few train
  personas. Reports how far T0's expected reward spreads across pitches (the go/no-go: a policy can only learn
  what moves its reward), the rank correlation of T0's scores with every other simulator's (an exploit of T0
  that P3/P4 do not reward needs them to disagree), and which pitch features T0 rewards.
- **Fidelity cards**: per simulator, the perplexity of held-out people's own turns at the simulator's
  temperature, and how far its decisions (the exact distribution, given each held-out person's real pitch)
  are from those people's real donations (Wasserstein-1, dollars).
- **Positive control**: a few steps with reward = "the pitch mentions children", per learning rate, to choose
  one that moves a reward the policy surely can learn.
- **Verdicts**: each pre-registered signature of recipes/p4g_pitch/NOTES.md computed from the grid's runs,
  held or not held, with its numbers.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
from collections import Counter
from typing import Any, Callable

import numpy as np

from scope.stats import fmt

TEMPLATES = [
    "Please donate to Save the Children.",
    "Would you give some of your $2 to Save the Children? Every cent helps a child in need.",
    "Children around the world are hungry tonight. Your $2 can feed one of them.",
    "Please donate all $2 to Save the Children. It would mean the world to a child.",
    "Could you spare $1 for Save the Children?",
    "Even $0.50 helps Save the Children bring medicine to a sick child.",
    "Hi! How are you today?",
    "You earned $2. Keep it, you deserve it.",
    "Don't donate anything, the money is yours.",
    "Save the Children helps kids in over 100 countries with food, schooling and health care.",
    "Imagine a child who has nothing to eat. You can change that right now with your $2.",
    "God bless you. Please share your blessing with children in need.",
    "Thank you so much for your kindness! Would you donate your $2 to help children?",
    "Donate $2 now.",
    "I donated my own $2 to Save the Children today. Will you join me?",
    "Most people in this study give at least $1 to Save the Children.",
    "Hello [Name], I am writing on behalf of Save the Children to ask for your support.",
    "Kids in war zones need schools and safety. Save the Children is there. Can you help with your $2?",
    "It is only $2, but to a child in poverty it is a meal and a chance.",
    "Are you a parent? Then you know how much every child matters. Please give to Save the Children.",
    "The weather is nice today, isn't it?",
    "Giving feels good, and your $2 goes straight to children who need it most.",
    "Your donation is tax deductible and helps children worldwide.",
    "Please, please, please donate to the children!",
]
"""Written pitches for the pilot: asks of every size, no ask, off-topic and discouraging ones."""

FEATURES: dict[str, str] = {
    "children": r"\b(child|children|kids?)\b",
    "charity_name": r"save the children",
    "dollar_amount": r"\$\s*\d|\bdollars?\b",
    "question": r"\?",
    "please": r"\bplease\b",
    "exclamation": r"!",
    "greeting": r"^\W*(hi|hello|hey|dear|greetings)\b",
    "thanks": r"\bthank",
    "faith": r"\b(god|lord|bless\w*|pray\w*|faith)\b",
    "placeholder": r"\[[^\]]*\]",
    "urgency": r"\b(now|today|urgent\w*|immediately|right away)\b",
    "first_person": r"\b(i|i'm|i've|we|we're|our|my)\b",
    "donate_word": r"\bdonat\w*",
}
"""Pitch features (regular expressions, case-insensitive) whose reward the pilot and the verdicts read."""


def features(pitch: str) -> dict[str, bool]:
    return {k: bool(re.search(rx, pitch, re.IGNORECASE)) for k, rx in FEATURES.items()}


def ablate(pitch: str, feature: str) -> str:
    """``pitch`` with every span that matches ``feature`` removed (spaces tidied)."""
    out = re.sub(FEATURES[feature], " ", pitch, flags=re.IGNORECASE)
    return re.sub(r"\s+", " ", out).strip()


# ---- diversity ------------------------------------------------------------------------------------------
def _ngrams(words: list[str], n: int) -> Counter:
    return Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def bleu(hyp: str, refs: list[str], max_n: int = 4) -> float:
    """Sentence BLEU-4 of ``hyp`` against ``refs`` (lower-cased words; add-one smoothing of the n-gram
    precisions for n > 1; the usual brevity penalty with the closest reference length)."""
    h = hyp.lower().split()
    rs = [r.lower().split() for r in refs]
    if not h or not rs:
        return 0.0
    logs = []
    for n in range(1, max_n + 1):
        hc = _ngrams(h, n)
        total = sum(hc.values())
        best: Counter = Counter()
        for r in rs:
            best |= _ngrams(r, n)
        match = sum(min(c, best[g]) for g, c in hc.items())
        if n == 1:
            if match == 0:
                return 0.0
            logs.append(math.log(match / total))
        else:
            logs.append(math.log((match + 1) / (total + 1)))
    closest = min((abs(len(r) - len(h)), len(r)) for r in rs)[1]
    bp = 1.0 if len(h) > closest else math.exp(1 - closest / len(h))
    return bp * math.exp(sum(logs) / len(logs))


def group_diversity(groups: list[list[str]]) -> dict[str, float]:
    """Within each group of pitches: the share of distinct pitches and the self-BLEU (each pitch against the
    others of its group); means over the groups."""
    distinct, sb = [], []
    for g in groups:
        if len(g) < 2:
            continue
        distinct.append(len(set(g)) / len(g))
        sb.append(float(np.mean([bleu(p, g[:i] + g[i + 1:]) for i, p in enumerate(g)])))
    return {"distinct": float(np.mean(distinct)) if distinct else math.nan,
            "self_bleu": float(np.mean(sb)) if sb else math.nan}


# ---- simulators and scoring -----------------------------------------------------------------------------
def _configs(configs: str) -> list[str]:
    return sorted(f for f in os.listdir(configs) if f.endswith(".yaml") and f not in ("common.yaml", "panel.yaml",
                                                                                      "grid.yaml"))


def load(configs: str, overrides: list[str] | None = None, base: str = "single.yaml",
         extra: dict[str, Any] | None = None):
    """The experiment's models, loaded once: (config, backends, the untrained persuader's binding, simulators)
    where simulators maps an id to (binding, env options over the config's, group): every frozen training
    simulator of the grid's configs (group ``train``) and every panel member (``seen``, ``unseen``,
    ``control``)."""
    from scope.config import PartnerSpec
    from scope.configfile import load_config
    from scope.eval import load_panel
    from scope.models.loading import frozen_refs
    from scope.partners.binding import spec_binding
    from scope.setup import build_models

    overrides = list(overrides or [])
    cfg = load_config(os.path.join(configs, base), overrides)
    if cfg.run.threads:
        import torch

        torch.set_num_threads(cfg.run.threads)
    panel = load_panel(cfg.eval.panel) if cfg.eval.panel else None
    backends, _, trainable = build_models(cfg)
    models = dict(cfg.models)
    if panel is not None:
        models.update(panel.models)
    sims: dict[str, tuple[Any, dict[str, Any], str]] = {}
    cfgs = [load_config(os.path.join(configs, f), overrides) for f in _configs(configs)]
    for c in cfgs:
        models.update({k: v for k, v in c.models.items() if k not in models})
    models.update(extra or {})
    refs = frozen_refs(models, backends, cfg.run.seed)
    if panel is not None:
        for p in panel.partners:
            group = "control" if p.control else "seen" if p.seen else "unseen"
            sims[p.spec_id()] = (spec_binding(p, refs[p.model]), dict(p.env_options), group)
    for c in cfgs:
        if c.partner.trainable:
            continue
        for spec in c.partner.specs():
            if spec.spec_id() not in sims:
                sims[spec.spec_id()] = (spec_binding(spec, refs[spec.model]), {}, "train")
    for sid in extra or {}:  # a simulator of no config (a fidelity card's only): T=0.7, as the others
        sims[sid] = (spec_binding(PartnerSpec(model=sid, temperature=0.7, max_new_tokens=16), refs[sid]), {}, "card")
    agent = spec_binding(cfg.agent, trainable["agent"])
    return cfg, backends, agent, sims


def sample_pitches(cfg, agent, n: int, seed: int) -> list[str]:
    """``n`` pitches from the persuader as the environment asks for them (its prompt, its temperature)."""
    from scope.envs.base import get_env
    from scope.eval import fixed_sampling
    from scope.rollout import encode, render
    from scope.types import Task

    env = get_env(cfg.env.name)(Task("pilot", "train", {}), random.Random(0),
                                **{k: v for k, v in cfg.env.options.items() if k not in ("personas", "data_dir")})
    tok = agent.ref.tokenizer
    prompt = encode(tok, render(tok, env.views["agent"], True))
    with fixed_sampling([agent.ref], seed):
        outs = agent.ref.generate([prompt] * n, agent.sampling)
    return [c.text for c in outs]


def score_pairs(cfg, pairs: list[tuple[str, Any]], sims: dict[str, tuple[Any, dict, str]], seed: int = 0,
                progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Each (pitch, task) pair under every simulator, the pitch replayed as the persuader's turn: per simulator,
    the agent's reward of each pair (the expected one; the sampled one for a simulator that decides in words;
    nan where the episode failed), the expected amount, and the number of failed episodes."""
    from scope.envs.base import get_env
    from scope.eval import ReplayRef, fixed_sampling
    from scope.partners.binding import Binding
    from scope.rollout import Play, make_jobs, run_rollouts
    from scope.types import Episode, SamplingParams

    env_cls = get_env(cfg.env.name)
    out: dict[str, dict[str, Any]] = {}
    for k, (sid, (binding, opts, group)) in enumerate(sims.items()):
        options = dict(cfg.env.options, **opts)
        plays = [Play(t, Episode(t.id, f"score:{i}", 0),
                      {"agent": Binding("replay", ReplayRef([p]), SamplingParams()), "partner": binding})
                 for i, (p, t) in enumerate(pairs)]
        jobs = make_jobs(env_cls, plays, options, random.Random(seed), "pitch-score")
        with fixed_sampling([binding.ref], seed * 1_000_003 + k):
            eps, _ = run_rollouts(jobs, max_context=cfg.rollout.max_context, end_on_truncation=False)
        out[sid] = {"group": group, "rewards": [math.nan if e.failed else e.rewards["agent"] for e in eps],
                    "amounts": [math.nan if e.failed else e.meta.get("expected_amount", math.nan) for e in eps],
                    "failed": sum(e.failed for e in eps)}
        if progress:
            progress(f"scored {len(pairs)} pitches under {sid} (mean {np.nanmean(out[sid]['rewards']):.3f})")
    return out


def score(cfg, pitches: list[str], tasks: list, sims: dict[str, tuple[Any, dict, str]], seed: int = 0,
          progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every pitch to every task's persona under every simulator: ``rewards[pitch][task]`` per simulator."""
    pairs = [(p, t) for p in pitches for t in tasks]
    flat = score_pairs(cfg, pairs, sims, seed, progress)
    n = len(tasks)
    return {sid: {**v, "rewards": [v["rewards"][i:i + n] for i in range(0, len(pairs), n)],
                  "amounts": [v["amounts"][i:i + n] for i in range(0, len(pairs), n)]} for sid, v in flat.items()}


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum() < 3 or np.std(a[ok]) == 0 or np.std(b[ok]) == 0:
        return math.nan
    return float(spearmanr(a[ok], b[ok]).statistic)


def _boot_diff(x: np.ndarray, mask: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of x where mask minus where not, with a 95% percentile bootstrap interval over the pitches."""
    rng = np.random.default_rng(seed)
    if mask.sum() < 2 or (~mask).sum() < 2:
        return math.nan, math.nan, math.nan
    d = float(x[mask].mean() - x[~mask].mean())
    draws = []
    for _ in range(resamples):
        i = rng.integers(0, len(x), len(x))
        m = mask[i]
        if m.sum() and (~m).sum():
            draws.append(x[i][m].mean() - x[i][~m].mean())
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return d, float(lo), float(hi)


UNSEEN = ("P3", "P4")
"""The panel's unseen simulators, by id."""
GO_SPREAD = 0.08
"""Go if T0's expected reward spreads across pitches by at least this much (the standard deviation over the
sampled pitches of their mean over the pilot's personas)."""


def analyse(pitches: list[str], n_sampled: int, scores: dict[str, dict[str, Any]], reference: str = "T0",
            unseen: tuple[str, ...] = ("P3", "P4")) -> dict[str, Any]:
    """The pilot's numbers from its scores (see the module docstring)."""
    per = {sid: np.asarray(s["rewards"], dtype=float) for sid, s in scores.items()}
    mean = {sid: np.nanmean(r, axis=1) for sid, r in per.items()}  # per pitch: mean over the personas
    sampled = slice(0, n_sampled)
    sims: dict[str, Any] = {}
    for sid, r in per.items():
        rs = r[sampled]
        sims[sid] = {"group": scores[sid]["group"], "mean": float(np.nanmean(rs)),
                     "pitch_spread": float(np.nanstd(mean[sid][sampled], ddof=1)),
                     "within_persona_spread": float(np.nanmean(np.nanstd(rs, axis=0, ddof=1))),
                     "range": [float(np.nanmin(mean[sid][sampled])), float(np.nanmax(mean[sid][sampled]))],
                     "templated_mean": float(np.nanmean(r[n_sampled:])) if len(r) > n_sampled else math.nan,
                     "failed": scores[sid]["failed"]}
    corr = {a: {b: _spearman(mean[a][sampled], mean[b][sampled]) for b in per} for a in per}
    corr_all = {a: {b: _spearman(mean[a], mean[b]) for b in per} for a in per}
    feats = [features(p) for p in pitches[:n_sampled]]
    words = np.array([len(p.split()) for p in pitches[:n_sampled]], dtype=float)
    feat_rows = {}
    for f in FEATURES:
        m = np.array([x[f] for x in feats])
        row: dict[str, Any] = {"share": float(m.mean())}
        for sid in per:
            d, lo, hi = _boot_diff(mean[sid][sampled], m)
            row[sid] = {"diff": d, "lo": lo, "hi": hi}
        feat_rows[f] = row
    length = {sid: _spearman(words, mean[sid][sampled]) for sid in per}
    ref = mean.get(reference)
    order = np.argsort(-ref[sampled]) if ref is not None else np.array([], dtype=int)
    show = lambda i: {"pitch": pitches[i], **{sid: float(mean[sid][i]) for sid in per}}  # noqa: E731
    spread = sims.get(reference, {}).get("pitch_spread", math.nan)
    return {"simulators": sims, "spearman": corr, "spearman_all": corr_all, "features": feat_rows,
            "length_spearman": length, "top": [show(int(i)) for i in order[:5]],
            "bottom": [show(int(i)) for i in order[::-1][:5]],
            "templated": [show(n_sampled + i) for i in range(len(pitches) - n_sampled)],
            "reference": reference, "unseen": list(unseen), "go_threshold": GO_SPREAD,
            "reference_spread": spread, "go": bool(spread >= GO_SPREAD),
            "reference_vs_unseen": {u: corr.get(reference, {}).get(u, math.nan) for u in unseen}}


def pilot(configs: str, out: str, n_sampled: int = 256, n_personas: int = 4, overrides: list[str] | None = None,
          seed: int = 0, only: list[str] | None = None, log: Callable[[str], None] = print, base: str = "single.yaml",
          reference: str = "T0", unseen: tuple[str, ...] = UNSEEN) -> dict[str, Any]:
    """Sample the pitches, score them under every simulator (``only``: these) on ``n_personas`` train
    personas, write ``pilot.json`` and ``pilot.md`` in ``out``. ``base``: the config whose persuader samples;
    ``reference``: the simulator whose spread is the go/no-go; ``unseen``: the ones its scores are compared with."""
    import time


    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    cfg, _, agent, sims = load(configs, overrides, base)
    if only:
        missing = [s for s in only if s not in sims]
        if missing:
            raise ValueError(f"pilot: no simulator {missing}; the experiment has {', '.join(sims)}")
        sims = {k: v for k, v in sims.items() if k in only}
    from scope.envs.tasks import load_tasks

    tasks = load_tasks(cfg.env, cfg.env.train_split)
    random.Random(seed).shuffle(tasks)
    tasks = tasks[:n_personas]
    sampled = sample_pitches(cfg, agent, n_sampled, seed)
    pitches = sampled + list(TEMPLATES)
    log(f"pilot: {len(sampled)} sampled + {len(TEMPLATES)} written pitches, {len(tasks)} personas, "
        f"{len(sims)} simulators")
    scores = score(cfg, pitches, tasks, sims, seed, progress=log)
    res = analyse(pitches, n_sampled, scores, reference=reference, unseen=tuple(u for u in unseen if u in scores))
    res.update(pitches=pitches, n_sampled=n_sampled, personas=[t.id for t in tasks], scores=scores,
               seconds=time.time() - t0)
    with open(os.path.join(out, "pilot.json"), "w") as f:
        json.dump(res, f, indent=1, default=float)
    with open(os.path.join(out, "pilot.md"), "w") as f:
        f.write(pilot_markdown(res))
    log(f"pilot: wrote {out}/pilot.md ({time.time() - t0:.0f}s); {reference}'s spread {res['reference_spread']:.3f} "
        f"-> {'GO' if res['go'] else 'NO-GO'}")
    return res


def pilot_markdown(res: dict[str, Any]) -> str:
    sims = res["simulators"]
    ids = list(sims)
    ref = res["reference"]
    lines = ["# P4G-pitch pilot", "",
             f"{res['n_sampled']} pitches sampled from the untrained persuader and {len(res['templated'])} written "
             f"ones, each scored by every simulator on the same {len(res['personas'])} train personas "
             "(expected reward; the `verbal` control's is one sampled decision). A pitch's score is its mean over "
             "the personas.", "",
             f"**Go/no-go:** {ref}'s spread across the sampled pitches (std of the pitch scores) is "
             f"{fmt(res['reference_spread'])} against a threshold of {res['go_threshold']}: "
             f"**{'GO' if res['go'] else 'NO-GO'}**. Spearman correlation of {ref}'s pitch scores with the unseen "
             "simulators': " + ", ".join(f"{u} {fmt(v, 2)}" for u, v in res["reference_vs_unseen"].items()) + ".", "",
             "| simulator | group | mean reward | spread across pitches | spread within a persona | range of "
             "pitch scores | written pitches' mean | failed |", "|---|---|---|---|---|---|---|---|"]
    for sid, s in sims.items():
        lines.append(f"| {sid} | {s['group']} | {fmt(s['mean'])} | {fmt(s['pitch_spread'])} | "
                     f"{fmt(s['within_persona_spread'])} | {fmt(s['range'][0])} - {fmt(s['range'][1])} | "
                     f"{fmt(s['templated_mean'])} | {s['failed']} |")
    lines += ["", "Spearman correlation of the simulators' scores over the sampled pitches:", "",
              "| | " + " | ".join(ids) + " |", "|---|" + "---|" * len(ids)]
    for a in ids:
        lines.append(f"| {a} | " + " | ".join(fmt(res["spearman"][a][b], 2) for b in ids) + " |")
    lines += ["", "What the simulators reward (sampled pitches): a feature's score difference, pitches with it "
              "minus without, with a 95% bootstrap interval over the pitches; `share`: how many pitches have it.", "",
              "| feature | share | " + " | ".join(ids) + " |", "|---|---|" + "---|" * len(ids)]
    for f, row in res["features"].items():
        lines.append(f"| {f} | {fmt(row['share'], 2)} | " + " | ".join(
            f"{fmt(row[s]['diff'], 3)} [{fmt(row[s]['lo'], 3)}, {fmt(row[s]['hi'], 3)}]" for s in ids) + " |")
    lines.append("| length (Spearman with words) | | " + " | ".join(fmt(res["length_spearman"][s], 2) for s in ids)
                 + " |")
    for title, key in ((f"Sampled pitches {ref} scores highest", "top"), ("... and lowest", "bottom"),
                       ("Written pitches", "templated")):
        lines += ["", f"{title}:", "", "| pitch | " + " | ".join(ids) + " |", "|---|" + "---|" * len(ids)]
        for row in res[key]:
            text = row["pitch"].replace("|", "/").replace("\n", " ")[:160]
            lines.append(f"| {text} | " + " | ".join(fmt(row[s], 2) for s in ids) + " |")
    return "\n".join(lines) + "\n"


# ---- fidelity cards -------------------------------------------------------------------------------------
def fidelity(configs: str, out: str, n_dialogues: int = 48, overrides: list[str] | None = None,
             log: Callable[[str], None] = print, base: str = "single.yaml",
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per simulator with a forced decision: the perplexity of held-out people's turns at its temperature (48
    dialogues of the test persuadees, P4G-pitch's short-persona prompt) and the same in bits per byte of their
    text (which, unlike a perplexity, compares across tokenizers), and its decisions given each held-out
    person's real pitch against what those people gave (no amount counts as $0): Wasserstein-1 in dollars,
    means and shares of $0. ``extra``: more simulators (model id -> ``ModelConfig``) to card. Writes
    ``fidelity.json`` / ``fidelity.md``."""
    from scipy.stats import wasserstein_distance

    from .env import NO_AMOUNT
    from scope.rollout import encode, render
    from scope.data.p4g import load_dialogues
    from scope.sim.fit import examples, perplexity

    from .fit import decision_view, system_prompt

    os.makedirs(out, exist_ok=True)
    cfg, _, _, sims = load(configs, overrides, base, extra)
    data_dir = cfg.env.options.get("data_dir")
    test = [d for d in load_dialogues(data_dir, "test") if decision_view(d) is not None]
    people = [float(d.donation or 0.0) for d in test]
    cards: dict[str, Any] = {"people": {"n": len(people), "mean": float(np.mean(people)),
                                        "zero_share": float(np.mean([x == 0 for x in people]))}}
    for sid, (b, opts, group) in sims.items():
        if opts.get("decision") == "verbal" or b.note:
            continue  # the card is of a simulator as the forced decision plays it, with no note of its own
        tok, backend, adapter = b.ref.tokenizer, b.ref.backend, b.ref.adapter
        held = examples(tok, test[:n_dialogues], 512, lambda d: [d.partner_view(system_prompt(d))])
        ppl = perplexity(backend, adapter, held, 512, temperature=b.sampling.temperature)
        n_tok = sum(sum(m[1:]) for _, m in held)  # the scored tokens (each turn's text and its end-of-turn token)
        n_bytes = sum(len(tok.decode([t for t, k in zip(ids[1:], m[1:]) if k], skip_special_tokens=True).encode())
                      for ids, m in held)
        bpb = math.log(ppl) * n_tok / (math.log(2) * max(n_bytes, 1))
        prompts = [encode(tok, render(tok, (decision_view(d) or [])[:2], True) + "[DONATE $") for d in test]
        res = b.ref.readout(prompts, b.sampling, _amount_readout())
        vals, wts = [], []
        for r in res:
            for a, p in r.dist.items():
                vals.append(0.0 if a == NO_AMOUNT else float(a))
                wts.append(p)
        w1 = float(wasserstein_distance(vals, people, u_weights=wts))
        means = [sum(p * (0.0 if a == NO_AMOUNT else float(a)) for a, p in r.dist.items()) for r in res]
        zero = [sum(p for a, p in r.dist.items() if a == NO_AMOUNT or float(a) == 0.0) for r in res]
        cards[sid] = {"group": group, "temperature": b.sampling.temperature, "perplexity": ppl,
                      "bits_per_byte": bpb, "wasserstein": w1,
                      "mean_amount": float(np.mean(means)), "zero_share": float(np.mean(zero)),
                      "no_amount": float(np.mean([r.dist.get(NO_AMOUNT, 0.0) for r in res])),
                      "dialogues": len(held), "people": len(test)}
        log(f"fidelity: {sid}: perplexity {ppl:.2f}, W1 {w1:.3f}, mean ${cards[sid]['mean_amount']:.2f}")
    with open(os.path.join(out, "fidelity.json"), "w") as f:
        json.dump(cards, f, indent=1)
    with open(os.path.join(out, "fidelity.md"), "w") as f:
        f.write(fidelity_markdown(cards))
    return cards


def _amount_readout():
    from .env import AMOUNT

    return AMOUNT


def fidelity_markdown(cards: dict[str, Any]) -> str:
    pe = cards["people"]
    lines = ["| simulator | group | T | perplexity of held-out people's turns | bits per byte | W1 to their donations "
             "($) | mean decision ($) | share of $0 | share with no amount |", "|---|---|---|---|---|---|---|---|---|"]
    for sid, c in cards.items():
        if sid == "people":
            continue
        lines.append(f"| {sid} | {c['group']} | {c['temperature']} | {fmt(c['perplexity'], 2)} | "
                     f"{fmt(c.get('bits_per_byte'), 3)} | {fmt(c['wasserstein'])} | {fmt(c['mean_amount'], 2)} | "
                     f"{fmt(c['zero_share'], 2)} | {fmt(c['no_amount'], 3)} |")
    lines.append(f"| held-out people ({pe['n']}) | | | | | 0 | {fmt(pe['mean'], 2)} | {fmt(pe['zero_share'], 2)} | |")
    return "\n".join(lines) + "\n"


# ---- positive control -----------------------------------------------------------------------------------
def positive_control(configs: str, out: str, lrs: tuple[float, ...] = (1e-4, 3e-4), steps: int = 8,
                     overrides: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """``steps`` training steps per learning rate with reward = the pitch mentions children, KL as configured;
    the choice: the learning rate whose mean reward over the last 3 steps is highest (the smaller on a tie
    within 0.02). Writes ``control.json`` / ``control.md``."""
    from scope.configfile import load_config
    from scope.run import read_metrics
    from scope.train import train

    runs: dict[str, dict[str, Any]] = {}
    for lr in lrs:
        d = os.path.join(out, f"lr{lr:g}")
        cfg = load_config(os.path.join(configs, "single.yaml"), list(overrides or []) + [
            "env.options.reward=mentions_children", f"train.lr={lr}", f"train.steps={steps}", "eval.panel=null",
            f"run.dir={d}", f"run.save_every={steps}", "run.save_rollouts=false"])
        from scope.grid.records import finished as _finished

        if not _finished(d, steps):
            resume = os.path.exists(os.path.join(d, "metrics.jsonl"))
            train(cfg, resume=resume, log=lambda s, lr=lr: log(f"control lr {lr:g}: {s}"))  # type: ignore[misc]
        ms = [m for m in read_metrics(d) if "reward_mean" in m]
        runs[f"{lr:g}"] = {"lr": lr, "reward": [m["reward_mean"] for m in ms],
                           "kl": [m.get("train/kl", math.nan) for m in ms],
                           "entropy": [m.get("policy_entropy", math.nan) for m in ms],
                           "step_seconds": [m.get("step_seconds", math.nan) for m in ms]}
    end = {k: float(np.mean(r["reward"][-3:])) for k, r in runs.items()}
    best = max(end.values())
    chosen = min((runs[k]["lr"] for k, v in end.items() if v >= best - 0.02))
    res = {"runs": runs, "end": end, "chosen_lr": chosen, "kl_coef": cfg.train.kl_coef, "steps": steps}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "control.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = [f"Positive control: reward 1 when the pitch says child/children, {steps} steps, KL "
             f"{cfg.train.kl_coef}, {cfg.rollout.n_tasks} personas x G={cfg.rollout.group_size}.", "",
             "| lr | reward per step | mean of the last 3 | KL to the base, last step (nats/token) | entropy first -> "
             "last | seconds per step |", "|---|---|---|---|---|---|"]
    for k, r in runs.items():
        secs = float(np.nanmean(r["step_seconds"]))
        lines.append(f"| {k} | {' '.join(fmt(x, 2) for x in r['reward'])} | {fmt(end[k])} | {fmt(r['kl'][-1], 4)} | "
                     f"{fmt(r['entropy'][0], 2)} -> {fmt(r['entropy'][-1], 2)} | {fmt(secs, 1)} |")
    lines += ["", f"Chosen: lr {chosen:g} (highest mean reward over the last 3 steps; the smaller on a tie within "
                  "0.02)."]
    with open(os.path.join(out, "control.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    log(f"control: chose lr {chosen:g}")
    return res
