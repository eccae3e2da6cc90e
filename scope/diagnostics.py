"""Collapse diagnostics: within-group similarity of the agent's turns, partner behaviour classes
(modal mass at visited states), and the partner/agent decomposition of the group reward variance.

Behaviour classifiers are registered per environment name; P4G's default sorts a persuadee reply
into donate / refuse / question / push_back / other with rules.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Callable, Sequence

from .registry import Registry
from .types import Episode

CLASSIFIERS: Registry[Callable[[str], str]] = Registry("behaviour classifier", group="scope.classifiers")
"""Each environment's partner-behaviour classifier (reply -> class), registered when its module loads."""


def classifier_of(env_name: str) -> Callable[[str], str] | None:
    """The partner-behaviour classifier of an environment (it registers its own when its module loads)."""
    from .envs.base import get_env

    try:
        get_env(env_name)
    except KeyError:
        return None
    return CLASSIFIERS.find(env_name)


def register_classifier(env_name: str) -> Callable[[Callable[[str], str]], Callable[[str], str]]:
    return CLASSIFIERS.register(env_name)


@register_classifier("p4g")
def p4g_behaviour(text: str) -> str:
    from .envs.p4g import parse_donation

    t = text.lower()
    if parse_donation(text) is not None:
        return "donate"
    if re.search(r"\b(no|nope|won'?t|will not|not interested|can'?t|cannot|don'?t want|refuse|pass)\b", t):
        return "refuse"
    if re.search(r"\b(but|however|not sure|why should|doubt|prove|skeptic|scam)\b", t):
        return "push_back"
    if "?" in t:
        return "question"
    return "other"


# ---- within-group similarity -------------------------------------------------------------------
def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())


def _ngrams(toks: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Unique n-grams / all n-grams over the texts (1.0 = no repetition; 0 when there are none)."""
    grams = [g for t in texts for g in _ngrams(_tokens(t), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def bleu(hyp: str, refs: Sequence[str], max_n: int = 4) -> float:
    """Sentence BLEU-4 with the brevity penalty; the 2- to 4-gram precisions are add-one smoothed (Lin and
    Och's smoothing), the unigram precision is not, so texts with no word in common score 0."""
    h = _tokens(hyp)
    rs = [_tokens(r) for r in refs]
    if not h or not rs:
        return 0.0
    logp = 0.0
    for n in range(1, max_n + 1):
        hc = Counter(_ngrams(h, n))
        maxref: Counter = Counter()
        for r in rs:
            for g, c in Counter(_ngrams(r, n)).items():
                maxref[g] = max(maxref[g], c)
        match = sum(min(c, maxref[g]) for g, c in hc.items())
        total = max(len(h) - n + 1, 0)
        if n == 1:
            if match == 0:
                return 0.0
            logp += math.log(match / total)
        else:
            logp += math.log((match + 1) / (total + 1))
    closest = min((abs(len(r) - len(h)), len(r)) for r in rs)[1]
    bp = 1.0 if len(h) > closest else math.exp(1 - closest / max(len(h), 1))
    return bp * math.exp(logp / max_n)


def self_bleu(texts: Sequence[str]) -> float:
    """Mean BLEU of each text against the others (1.0 = identical rollouts)."""
    texts = [t for t in texts if t.strip()]
    if len(texts) < 2:
        return 0.0
    return sum(bleu(t, texts[:i] + texts[i + 1:]) for i, t in enumerate(texts)) / len(texts)


def _role_text(ep: Episode, role: str) -> str:
    return "\n".join(m["content"] for m in ep.messages if m["role"] == role)


def _groups(episodes: Sequence[Episode]) -> dict[str, list[Episode]]:
    g: dict[str, list[Episode]] = {}
    for e in episodes:
        if not e.failed:
            g.setdefault(e.group_id, []).append(e)
    return g


def group_similarity(episodes: Sequence[Episode], role: str = "agent") -> dict[str, float]:
    d1, d2, sb = [], [], []
    for eps in _groups(episodes).values():
        if len(eps) < 2:
            continue
        texts = [_role_text(e, role) for e in eps]
        d1.append(distinct_n(texts, 1))
        d2.append(distinct_n(texts, 2))
        sb.append(self_bleu(texts))
    mean = lambda x: sum(x) / len(x) if x else 0.0  # noqa: E731
    return {"distinct_1": mean(d1), "distinct_2": mean(d2), "self_bleu": mean(sb)}


# ---- partner behaviour ------------------------------------------------------------------------
def behaviour_stats(episodes: Sequence[Episode], classify: Callable[[str], str], role: str = "partner"
                    ) -> dict[str, float]:
    """Modal mass of ``role``'s behaviour classes at the same dialogue state.

    A state is a task group and the exact conversation so far (every message before the reply): only
    replies given to the very same history are compared. Its modal mass is the share of the most
    frequent class among the replies given there; the estimate is the mean over states reached by at
    least two rollouts (1.0 = the partner always does the same thing there; an estimate of the paper's
    epsilon). Also returns the overall class shares and ``states`` (how many states were compared).
    ``modal_mass`` is absent when no state was reached twice.
    """
    states: dict[tuple, list[str]] = {}
    overall: Counter = Counter()
    for gid, eps in _groups(episodes).items():
        for e in eps:
            history: list[tuple[str, str]] = []
            for m in e.messages:
                if m["role"] == role:
                    c = classify(m["content"])
                    states.setdefault((gid, tuple(history)), []).append(c)
                    overall[c] += 1
                history.append((m["role"], m["content"]))
    masses = [Counter(cs).most_common(1)[0][1] / len(cs) for cs in states.values() if len(cs) >= 2]
    out = {"states": float(len(masses))}
    if masses:  # undefined (left out, not NaN) when no state was visited twice
        out["modal_mass"] = sum(masses) / len(masses)
    n = sum(overall.values())
    for c, k in overall.items():
        out[f"class/{c}"] = k / n
    return out


# ---- variance decomposition -------------------------------------------------------------------
def _svar(xs: Sequence[float]) -> float:
    """The unbiased sample variance (n - 1 in the denominator)."""
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def variance_decomposition(rewards) -> dict[str, float]:
    """The law of total variance within each task (the paper's Eq. 6, conditional on the task), with the
    one-way ANOVA's unbiased estimators.

    ``rewards[task][i][j]``: the reward of the j-th partner resample with the agent's turns of
    first-stage dialogue i of that task held fixed (a bare list of rows is one task). Per task:

    - partner = E_i[Var(R | agent turns)], estimated by the mean over dialogues of each row's sample
      variance (divided by J_i - 1), unbiased;
    - agent = Var_i(E[R | agent turns]): the sample variance of the row means (divided by I - 1) also
      holds the resampling noise of each mean, partner / J_i, which is subtracted.

    Each part is averaged over the tasks where it is defined (partner: a dialogue with two or more
    resamples; agent: two or more such dialogues). ``agent`` is clipped at 0 (``agent_raw`` keeps the
    unclipped estimate, which may be negative when the agent part is near 0). Differences between tasks
    belong to neither part. total = partner + agent.
    """
    tasks = list(rewards.values()) if isinstance(rewards, dict) else [rewards]
    partner, agent = [], []
    for rows in tasks:
        rows = [list(r) for r in rows if len(r) > 0]
        within = [_svar(r) for r in rows if len(r) > 1]
        if not within:
            continue
        w = sum(within) / len(within)
        partner.append(w)
        rows = [r for r in rows if len(r) > 1]
        if len(rows) > 1:
            means = [sum(r) / len(r) for r in rows]
            agent.append(_svar(means) - sum(w / len(r) for r in rows) / len(rows))
    p = sum(partner) / len(partner) if partner else 0.0
    a_raw = sum(agent) / len(agent) if agent else 0.0
    a = max(a_raw, 0.0)
    total = p + a
    return {"total": total, "partner": p, "agent": a, "agent_raw": a_raw,
            "partner_share": p / total if total > 0 else float("nan"), "tasks": float(len(tasks))}
