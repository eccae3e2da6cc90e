"""The intervals the tables print (scope.stats): Wilson for one simulator's mean, a bootstrap over the
tasks, paired across simulators and runs, for group means and differences."""
import random

import pytest

from scope.stats import cells_of, exceeds, group_mean, task_bootstrap, wilson


def test_wilson_is_not_zero_width_at_zero_successes():
    lo, hi = wilson(0.0, 8)
    assert lo == 0.0 and hi == pytest.approx(3.8415 / (8 + 3.8415), abs=1e-3)  # z^2 / (n + z^2)
    lo, hi = wilson(0.5, 100)
    assert lo == pytest.approx(0.404, abs=1e-3) and hi == pytest.approx(0.596, abs=1e-3)
    assert wilson(1.0, 8)[1] == 1.0 and wilson(1.0, 8)[0] < 1.0
    assert all(x != x for x in wilson(0.5, 0))  # nan for no episodes


def _eps(rewards_by_partner):
    """eval_episodes.jsonl-like records: partner -> task -> rewards of its copies."""
    return [{"task_id": t, "group_id": f"eval:{p}:{t}", "status": "done", "rewards": {"agent": r},
             "meta": {"partner": p}} for p, ts in rewards_by_partner.items() for t, rs in ts.items() for r in rs]


def test_cells_average_a_tasks_copies_and_skip_failed_episodes():
    eps = _eps({"a": {"t1": [1.0, 0.0], "t2": [1.0]}})
    eps.append({"task_id": "t2", "group_id": "eval:a:t2", "status": "failed", "rewards": {}, "meta": {"partner": "a"}})
    assert cells_of(eps) == {"a": {"t1": 0.5, "t2": 1.0}}


def test_the_bootstrap_pairs_the_tasks_of_every_simulator_and_run():
    rng = random.Random(0)
    tasks = [f"t{i}" for i in range(16)]
    base = {p: {t: float(rng.random() < 0.4) for t in tasks} for p in ("x", "y")}
    better = {p: {t: v + 0.1 for t, v in ts.items()} for p, ts in base.items()}  # +0.1 on every task
    alone = task_bootstrap([better], ["x", "y"], resamples=500)
    assert alone["lo"] < alone["mean"] < alone["hi"] and alone["hi"] - alone["lo"] > 0.15  # the tasks' spread
    diff = task_bootstrap([better], ["x", "y"], minus=[base], resamples=500)
    assert diff["mean"] == pytest.approx(0.1) and diff["lo"] == pytest.approx(0.1) and diff["hi"] == pytest.approx(0.1)
    assert group_mean([base, better], ["x", "y"], tasks) == pytest.approx(group_mean([base], ["x", "y"], tasks) + 0.05)


def test_the_bootstrap_interval_covers_the_true_mean_about_as_often_as_it_says():
    rng = random.Random(1)
    covered, trials = 0, 120
    for k in range(trials):
        cells = {"a": {f"t{i}": sum(rng.random() < 0.3 for _ in range(2)) / 2 for i in range(16)}}
        b = task_bootstrap([cells], ["a"], resamples=400, seed=k)
        covered += b["lo"] <= 0.3 <= b["hi"]
    assert 0.85 <= covered / trials <= 1.0


def test_a_difference_exceeds_its_noise_only_past_two_standard_errors():
    assert exceeds({"mean": 0.05, "se": 0.02}) and not exceeds({"mean": 0.035, "se": 0.03})
    assert not exceeds({"mean": 0.1, "se": float("nan")})
