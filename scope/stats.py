"""The intervals and tests that scope's tables report, in one place.

- :func:`wilson`: the Wilson score interval of a mean reward over ``n`` episodes. Exact in form for a binary
  reward (a proportion); for a reward in [0, 1] that is not binary it is conservative, since such a
  reward's variance is at most p(1 - p). Unlike mean ± s.e. it is not zero at 0/8 (0/8 gives [0, 0.32]).
- :func:`task_bootstrap`: a percentile bootstrap over the evaluation's tasks (personas, customers). Every
  simulator of a panel plays the same tasks, and every checkpoint and seed meets the same ones, so one
  resample of tasks is applied to every simulator and every run at once: the interval of a group mean (the
  mean of its simulators' means) and of a paired difference (a cure minus Single, a step minus Base)
  respect that pairing. It is the evaluation's noise given the trained policies; the spread between
  training seeds is reported beside it, not folded in.
- :func:`bootstrap_ci`, :func:`welch`, :func:`fisher`, :func:`holm`: the human study's tests.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np

Z95 = 1.959963984540054
RESAMPLES = 2000


TRAIN_WINDOW = 4
"""Steps over which every end-of-training figure is taken, in every table and plot (training reward, entropy and
zero-variance at the end: the mean of the last TRAIN_WINDOW steps; at the start: the mean of the first
TRAIN_WINDOW). The variance decomposition, measured every few steps only, is reported at its first and last
measurement."""


def window(xs: Sequence[float], end: bool = True) -> float | None:
    """The mean of the last (``end``) or first :data:`TRAIN_WINDOW` values; None when there are none."""
    xs = list(xs)[-TRAIN_WINDOW:] if end else list(xs)[:TRAIN_WINDOW]
    return sum(xs) / len(xs) if xs else None


def fmt(x: Any, nd: int = 3) -> str:
    """A figure as the tables print it: ``nd`` decimals, ``n/a`` for a missing or NaN one."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def mean_sd(xs: Sequence[float | None]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n - 1; 0 for one value) of the values that are there (None and
    NaN left out); (nan, nan) for none. The spread between training seeds in every grid table."""
    vals = [float(x) for x in xs if x is not None and not math.isnan(x)]
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    return m, (math.sqrt(sum((x - m) ** 2 for x in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0)


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a mean ``p`` in [0, 1] over ``n`` trials ((nan, nan) for n = 0)."""
    if n <= 0 or p is None or (isinstance(p, float) and math.isnan(p)):
        return float("nan"), float("nan")
    p = min(1.0, max(0.0, float(p)))
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


# ---- the panel's episodes as a table: run -> simulator -> task -> mean reward over the task's copies ----
Cells = dict[str, dict[str, float]]
"""One evaluation: simulator id -> task id -> the mean agent reward over that task's episodes."""


def cells_of(episodes: Iterable[dict[str, Any]]) -> Cells:
    """One evaluation's episodes (``eval_episodes.jsonl`` records) as :data:`Cells`; failed episodes are
    left out (an evaluation reports how many failed)."""
    acc: dict[str, dict[str, list[float]]] = {}
    for e in episodes:
        if e.get("status") == "failed":
            continue
        partner = e.get("meta", {}).get("partner") or e["group_id"].split(":")[1]
        acc.setdefault(partner, {}).setdefault(e["task_id"], []).append(float(e["rewards"].get("agent", 0.0)))
    return {p: {t: sum(v) / len(v) for t, v in ts.items()} for p, ts in acc.items()}


def group_mean(runs: Sequence[Cells], partners: Sequence[str], tasks: Sequence[str]) -> float:
    """Mean over ``runs`` of the mean over ``partners`` of each simulator's mean over ``tasks`` (a multiset:
    a bootstrap resample), the panel's own statistic (seen / unseen / all)."""
    per_run = []
    for cells in runs:
        means = []
        for p in partners:
            vals = [cells[p][t] for t in tasks if t in cells.get(p, {})]
            if vals:
                means.append(sum(vals) / len(vals))
        if means:
            per_run.append(sum(means) / len(means))
    return sum(per_run) / len(per_run) if per_run else float("nan")


def task_bootstrap(runs: Sequence[Cells], partners: Sequence[str], minus: Sequence[Cells] | None = None,
                   resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """The group mean of ``runs`` over ``partners`` (minus that of ``minus``, paired, when given) with its
    percentile bootstrap interval and standard error, resampling the tasks with replacement, the same
    resample for every simulator and run. Returns ``{"mean", "lo", "hi", "se", "tasks", "p"}`` (``p``: the
    two-sided bootstrap p-value of a zero statistic, twice the smaller tail share of the draws at 0)."""
    tasks = sorted({t for cells in list(runs) + list(minus or []) for p in partners for t in cells.get(p, {})})
    if not tasks:
        nan = float("nan")
        return {"mean": nan, "lo": nan, "hi": nan, "se": nan, "tasks": 0}

    def stat(ts: Sequence[str]) -> float:
        v = group_mean(runs, partners, ts)
        return v - group_mean(minus, partners, ts) if minus is not None else v

    rng = np.random.default_rng(seed)
    draws = np.array([stat([tasks[i] for i in rng.integers(0, len(tasks), len(tasks))]) for _ in range(resamples)])
    draws = draws[~np.isnan(draws)]
    lo, hi = np.quantile(draws, [(1 - level) / 2, 1 - (1 - level) / 2]) if draws.size else (math.nan, math.nan)
    # two-sided bootstrap p-value of "the statistic is 0" (for a paired difference)
    p = float(min(1.0, 2 * min((draws <= 0).mean(), (draws >= 0).mean()))) if draws.size else math.nan
    return {"mean": stat(tasks), "lo": float(lo), "hi": float(hi),
            "se": float(draws.std(ddof=1)) if draws.size > 1 else math.nan, "tasks": len(tasks), "p": p}


def exceeds(diff: dict[str, float], k: float = 2.0) -> bool:
    """Whether a paired difference from :func:`task_bootstrap` is more than ``k`` standard errors above 0."""
    return bool(diff["mean"] > k * diff["se"]) if not math.isnan(diff.get("se", math.nan)) else False


def spread(xs: Sequence[float | None]) -> tuple[float, float]:
    """The smallest and largest of the finite values (the seeds' range); (nan, nan) if none."""
    vals = [x for x in xs if x is not None and not math.isnan(x)]
    return (min(vals), max(vals)) if vals else (float("nan"), float("nan"))


# ---- the human study's tests --------------------------------------------------------------------------
def bootstrap_ci(xs: list[float], resamples: int = 10_000, seed: int = 0, level: float = 0.95
                 ) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean; (nan, nan) for an empty sample."""
    a = np.asarray(xs, dtype=float)
    if a.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def welch(a: list[float], b: list[float]) -> dict[str, float]:
    """Welch's t-test (two-sided): t, its Welch-Satterthwaite df and p."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return {"t": float("nan"), "df": float("nan"), "p": float("nan")}
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    if va + vb <= 1e-24 * (1.0 + float(np.mean(a)) ** 2 + float(np.mean(b)) ** 2):  # both constant
        same = float(np.mean(a)) == float(np.mean(b))
        return {"t": 0.0 if same else float("inf"), "df": float("nan"), "p": 1.0 if same else 0.0}
    r = stats.ttest_ind(a, b, equal_var=False)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return {"t": float(r.statistic), "df": float(df), "p": float(r.pvalue)}


def fisher(a: list[float], b: list[float]) -> dict[str, float]:
    """Fisher's exact test (two-sided) of two binary samples: odds ratio and p."""
    from scipy import stats

    if not a or not b:
        return {"odds_ratio": float("nan"), "p": float("nan")}
    a1, b1 = int(sum(a)), int(sum(b))
    r = stats.fisher_exact([[a1, len(a) - a1], [b1, len(b) - b1]])
    return {"odds_ratio": float(r.statistic), "p": float(r.pvalue)}


def holm(ps: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as ``ps``; nan stays nan and is not counted)."""
    idx = [i for i, p in enumerate(ps) if not math.isnan(p)]
    m = len(idx)
    order = sorted(idx, key=lambda i: ps[i])
    out = [float("nan")] * len(ps)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out
