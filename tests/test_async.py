"""Asynchronous rollouts (rollout.max_staleness): the bound, learning, resume, Co-Training's versions, and the
truncated importance sampling that corrects for the older weights."""
import json
import math
import time

import pytest
import torch

from helpers import tiny_run
from scope.config import parse_config
from scope.learner import Learner, LearnerConfig, grpo_loss
from scope.pipeline import Feed, staleness
from scope.rollout import RolloutStats
from scope.run import read_metrics
from scope.train import next_checkpoint, train
from scope.types import Episode, Trace


def bandit(run_dir, steps=12, **rollout):
    return parse_config({
        "run": {"dir": str(run_dir), "save_every": 100, "progress": False, "save_rollouts": False},
        "models": {"policy": {"path": "tiny-random"}},
        "agent": {"model": "policy", "trainable": True, "temperature": 1.0, "max_new_tokens": 16},
        "partner": {"model": "policy"},
        "env": {"name": "bandit_test"},
        "rollout": {"n_tasks": 4, "group_size": 8, "end_on_truncation": False, **rollout},
        "train": {"steps": steps, "lr": 1e-2, "kl_coef": 0.0}})


def test_one_step_off_policy_learns_and_never_passes_its_bound(tmp_path):
    """K = 1 on a task the tiny model can learn: the reward rises, and every step after the first trains on
    episodes exactly one version old."""
    train(bandit(tmp_path / "run", max_staleness=1), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "run"))
    r = [m["reward_mean"] for m in ms]
    assert sum(r[-3:]) / 3 > sum(r[:3]) / 3 + 0.15, r
    assert [m["async/staleness_max"] for m in ms] == [0.0] + [1.0] * 11
    assert all(m["async/dropped_episodes"] == 0 for m in ms)


def test_the_bound_holds_when_generation_is_slow_or_fast(tmp_path, monkeypatch):
    """Generation made slow on purpose: the learner waits instead of training on older weights. Training made
    slow: the generator never gets more than K steps ahead."""
    import scope.rollout_workers as rw

    run = rw.RolloutWorker.run

    def slow(self, *a, **kw):
        time.sleep(2.0)
        return run(self, *a, **kw)

    monkeypatch.setattr(rw.RolloutWorker, "run", slow)
    train(bandit(tmp_path / "slow", steps=5, max_staleness=2), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "slow"))
    assert max(m["async/staleness_max"] for m in ms) == 2 and all(m["async/in_flight"] <= 2 for m in ms)
    # the learner waited for the batches (2 s of generation each, about a second of training here)
    assert sum(m["async/wait_seconds"] for m in ms[1:]) > 1.0, [m["async/wait_seconds"] for m in ms]
    monkeypatch.setattr(rw.RolloutWorker, "run", run)
    import scope.learner as L

    update = L.Learner.update

    def slow_update(self, *a, **kw):
        time.sleep(0.3)
        return update(self, *a, **kw)

    monkeypatch.setattr(L.Learner, "update", slow_update)
    train(bandit(tmp_path / "fast", steps=5, max_staleness=2), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "fast"))
    assert [m["async/staleness_max"] for m in ms] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert all(m["async/in_flight"] <= 2 for m in ms)


class FakeAsync:
    """An AsyncRollout whose batches finish when asked for: records what was submitted when."""

    def __init__(self):
        self.stats, self.log = {}, []

    def submit(self, jobs, **kw):
        self.log.append(("submit", jobs[0]))
        return jobs

    def result(self, jobs):
        self.log.append(("result", jobs[0]))
        return [Episode(str(j), "g", 0, status="done") for j in jobs], RolloutStats()

    def publish(self):
        self.log.append(("publish", None))

    def __call__(self, jobs, **kw):
        return self.result(self.submit(jobs))

    def close(self):
        pass


def test_the_feed_submits_in_step_order_up_to_k_ahead_and_never_past_a_checkpoint():
    r = FakeAsync()
    cfg = parse_config({"run": {"save_every": 4}, "train": {"steps": 10}})
    feed = Feed(r, 2, "finish", lambda s: [s], {})
    for step in range(1, 11):
        jobs, eps, _, m = feed.take(step, next_checkpoint(step, cfg))
        assert jobs == [step] and m["async/in_flight"] <= 2
        feed.published()
    submits = [s for what, s in r.log if what == "submit"]
    assert submits == list(range(1, 11))
    # what was in flight when step s was trained: nothing past the checkpoints at 4 and 8 (nor past 10)
    order = [(w, s) for w, s in r.log if w != "publish"]
    assert order.index(("submit", 5)) > order.index(("result", 4))
    assert order.index(("submit", 9)) > order.index(("result", 8))
    assert order.index(("submit", 3)) < order.index(("result", 1))  # 2 ahead otherwise
    assert ("publish", None) in r.log
    with pytest.raises(TypeError, match="learner's thread only"):
        Feed(lambda jobs, **kw: None, 1, "drop", lambda s: [s], {})


def _ep(versions, role="agent", mid="policy:agent"):
    tr = Trace(role)
    for v in versions:
        tr.extend_generated([1], [-0.5], (mid, v))
    return Episode("t", "g", 0, status="done", traces={role: tr})


class Ref:
    def __init__(self, version):
        self.backend = type("B", (), {"name": "policy"})()
        self.adapter, self.version = "agent", version


def test_staleness_drops_or_keeps_what_passes_the_bound_and_counts_it():
    eps = [_ep([5]), _ep([3, 5]), _ep([2]), _ep([9], mid="policy:other")]
    owners = {"agent": (Ref(5), ["agent"])}
    kept, m = staleness(eps, owners, 2, "drop")
    assert kept["agent"] == [eps[0], eps[1], eps[3]]  # 0 and 2 old: kept; 3 old: dropped; not its model: kept
    assert m["async/staleness_max"] == 3 and m["async/staleness_mean"] == pytest.approx(5 / 3)
    assert m["async/dropped_episodes"] == 1 and m["async/over_bound_episodes"] == 1
    assert m["async/finished_episodes"] == 1
    kept, m = staleness(eps, owners, 2, "finish")
    assert kept["agent"] == eps and m["async/dropped_episodes"] == 0 and m["async/over_bound_episodes"] == 1


def test_resume_after_a_crash_mid_run_discards_what_was_under_way_and_draws_the_same_tasks(tmp_path):
    class Crash(Exception):
        pass

    over = {"rollout": {"max_staleness": 1}, "run": {"save_every": 2}}
    straight = tmp_path / "straight"
    train(tiny_run(straight, steps=5, **over), log=lambda s: None)

    def crash(step):
        if step == 3:  # step 4's rollouts are under way
            raise Crash()

    run = tmp_path / "run"
    with pytest.raises(Crash):
        train(tiny_run(run, steps=5, **over), on_step_end=crash, log=lambda s: None)
    lines = []
    train(tiny_run(run, steps=5, **over), resume=True, log=lines.append)
    assert any("resumed from step 2" in ln for ln in lines)
    assert any("asynchronous rollouts: a checkpoint holds no rollouts under way" in ln for ln in lines)
    assert [m["step"] for m in read_metrics(str(run))] == [1, 2, 3, 4, 5]

    def tasks(d, step):
        return sorted(json.loads(x)["task_id"] for x in open(d / "rollouts" / f"step_{step:06d}.jsonl"))

    for step in range(1, 6):
        assert tasks(run, step) == tasks(straight, step)
    ms = read_metrics(str(run))
    assert [m["async/staleness_max"] for m in ms] == [0.0, 1.0, 0.0, 1.0, 0.0]  # empty after each checkpoint


def test_cotraining_keeps_each_models_versions_apart(tmp_path):
    over = {"rollout": {"max_staleness": 1, "group_size": 3}, "run": {"save_every": 100},
            "partner": {"trainable": True, "reward": "adversarial"}}
    train(tiny_run(tmp_path / "c", steps=4, **over), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "c"))
    assert [m["async/staleness_max"] for m in ms] == [0.0, 1.0, 1.0, 1.0]
    assert [m["partner/async/staleness_max"] for m in ms] == [0.0, 1.0, 1.0, 1.0]
    for step in (1, 4):
        for rec in map(json.loads, open(tmp_path / "c" / "rollouts" / f"step_{step:06d}.jsonl")):
            assert rec["models"]["agent"] == [["policy:agent", max(step - 2, 0)]]
            assert rec["models"]["partner"] == [["policy:partner", max(step - 2, 0)]]


def test_truncated_importance_sampling_weights_each_token_by_the_capped_ratio():
    logp = torch.zeros(3, requires_grad=True)
    behaviour = torch.tensor([0.0, -1.0, -5.0])
    r = torch.exp(torch.zeros(3) - behaviour)
    w = r.clamp(max=2.0)
    t = grpo_loss(logp, torch.zeros(3), torch.ones(3), None, 0.2, 0.28, 0.0, is_weight=w)
    assert t.pg.tolist() == pytest.approx([-1.0, -2.0, -2.0])  # ratio 1 to the learner's own; weights 1, 2, 2
    assert w.tolist() == pytest.approx([1.0, 2.0, 2.0])


def test_a_learner_with_tis_trains_on_stale_tokens_that_the_plain_clip_ignores(tiny):
    tiny.add_lora("agent", r=4, alpha=8)
    ids = torch.randint(10, 500, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    mask = [0] * 8 + [1] * 16
    ids_t = torch.tensor([ids])
    learner = Learner(tiny, "agent", LearnerConfig(lr=1e-2, kl_coef=0.0, temperature=1.0, weight_decay=0.0))
    with torch.no_grad(), tiny.using("agent"):
        sel = torch.tensor([mask], dtype=torch.bool)
        sel[0, 0] = False
        lp = learner.module(ids_t, torch.ones_like(ids_t), sel)[0].tolist()
    # sampled by much older weights: their probabilities 5 nats below the learner's
    it = iter(lp)
    stale = [next(it) - 5.0 if m else 0.0 for m in mask]
    tr = Trace("agent", token_ids=ids, mask=mask, logprobs=stale, turn_model=[0 if m else -1 for m in mask],
               models=[("x", 0)])
    before = [p.detach().clone() for p in learner.params]
    out = learner.update([tr], [1.0])  # ratio to the behaviour ~ e^5: clipped, no gradient
    assert all(torch.equal(a, b) for a, b in zip(before, learner.params))
    assert "mismatch_kl" not in out
    learner = Learner(tiny, "agent", LearnerConfig(lr=1e-2, kl_coef=0.0, temperature=1.0, weight_decay=0.0,
                                                   tis_cap=2.0))
    out = learner.update([tr], [1.0])
    assert not all(torch.equal(a, b) for a, b in zip(before, learner.params))
    assert out["tis_truncated"] == pytest.approx(1.0)
    assert out["mismatch_kl"] == pytest.approx(math.exp(5) - 1 - 5, rel=1e-3)
    assert out["ratio"] == pytest.approx(1.0, abs=1e-4)


def test_a_panel_member_on_a_model_of_its_own_is_not_sent_to_the_generator(tmp_path):
    """The evaluation panel loads its members' models into the driver's table after the generator was built:
    they are the learner's to evaluate with, not weights to hand the generator's copy (which never built
    them: sending them once failed every episode of an asynchronous run of the collapse lab)."""
    panel = tmp_path / "panel.yaml"
    panel.write_text("episodes: 2\nmodels:\n  other: {path: tiny-random, dtype: float32}\npartners:\n"
                     "  - {id: seen-p, seen: true, model: policy}\n  - {id: other-p, seen: false, model: other}\n")
    cfg = bandit(tmp_path / "run", steps=4, max_staleness=1).model_dump()
    cfg["eval"] = {"panel": str(panel), "every": 1, "at_start": True}
    train(parse_config(cfg), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "run"))
    steps = [m for m in ms if "failed_episodes" in m]
    assert len(steps) == 4 and all(m["failed_episodes"] == 0 for m in steps), [m["failed_episodes"] for m in steps]
    assert sum("eval/partner/other-p" in m for m in ms) >= 4
