"""Collapse alarms (``monitor.alarms``, scope/alarms.py): a run against a scripted partner that collapses trips a
``stop`` and ends with its reason; a ``switch`` changes the partner mid-run and a resume keeps the new one; a
``warn`` reaches the trackers; re-scoring a run offline gives the alarms the live run fired, at the same steps."""
import json
import os

import pytest

from helpers import ScriptedRef, tiny_run
from scope.config import ConfigError
from scope.run import read_metrics
from scope.train import train


def with_scripted_partner(monkeypatch, replies):
    """Every run's partner is a scripted model that always gives the same replies (a collapsed simulator)."""
    import scope.train as T
    from scope.partners.binding import Binding
    from scope.partners.sources import SingleSource
    from scope.types import SamplingParams

    real = T.build_models

    def build(cfg):
        backends, sources, trainable = real(cfg)
        tok = trainable["agent"].backend.tokenizer
        sources["partner"] = SingleSource(Binding("scripted", ScriptedRef(tok, replies), SamplingParams()))
        return backends, sources, trainable

    monkeypatch.setattr(T, "build_models", build)


def test_a_collapsed_partner_trips_a_stop_and_the_run_ends_with_its_reason(tmp_path, monkeypatch):
    with_scripted_partner(monkeypatch, ["2]"])  # the forced decision always reads $2: one behaviour only
    run = tmp_path / "run"
    cfg = tiny_run(run, steps=6, diagnostics={"probe_every": 1, "probe_states": 2, "probe_samples": 2},
                   monitor={"alarms": [{"name": "modal", "detector": "partner_modal_mass_ceiling", "action": "stop"}]})
    logs: list[str] = []
    train(cfg, log=logs.append)
    ms = read_metrics(str(run))
    assert [m["step"] for m in ms] == [1]  # ended at the step the alarm fired, not at step 6
    assert ms[-1]["partner_behaviour/modal_mass"] == 1.0 and "alarm modal (partner_modal_mass_ceiling) at step 1" \
        in ms[-1]["stop_reason"]
    assert any(x.startswith("ALARM modal") for x in logs) and any(x.startswith("stopped: alarm modal") for x in logs)
    assert os.path.isdir(run / "checkpoints" / "step_000001")  # the stop keeps a checkpoint
    summary = open(run / "alarms.md").read()
    assert "| 1 | modal | partner_modal_mass_ceiling |" in summary and "The run stopped: alarm modal" in summary
    from scope.grid.records import finished

    assert finished(str(run), 6)  # a stopped run is done: a grid does not run it again


def _switch_cfg(run, steps):
    return tiny_run(run, steps=steps, run={"save_every": 1},
                    monitor={"alarms": [{"name": "flat", "detector": "zero_variance_ceiling", "threshold": -1.0,
                                         "window": 2, "action": "switch"}],
                             "fallback": {"id": "hot", "temperature": 1.4}})


def _partners(run):
    """step -> the partner ids of that step's rollouts."""
    out = {}
    for fn in sorted(os.listdir(run / "rollouts")):
        with open(run / "rollouts" / fn) as f:
            out[int(fn.split("_")[1].split(".")[0])] = {json.loads(x)["meta"]["partner"] for x in f}
    return out


def test_a_switch_changes_the_partner_and_a_resume_after_it_keeps_the_new_one(tmp_path):
    """The alarm fires at step 2 (its window's first full one): from step 3 the partner is the fallback; a run
    stopped at step 4 and resumed to 6 plays the fallback at steps 5 and 6, as the run made in one go does."""
    one = tmp_path / "one"
    train(_switch_cfg(one, 6), log=lambda s: None)
    seen = _partners(one)
    assert seen[1] == seen[2] == {"policy"} and all(seen[s] == {"hot"} for s in (3, 4, 5, 6))
    ms = read_metrics(str(one))
    assert [m["step"] for m in ms if m.get("partner_switched")] == [2]
    two = tmp_path / "two"
    train(_switch_cfg(two, 4), log=lambda s: None)
    train(_switch_cfg(two, 6), resume=True, log=lambda s: None)
    assert _partners(two) == seen
    # (timings differ, and the count of steps without a learning signal starts again in each sitting)
    volatile = ("seconds", "per_second", "no_signal_steps")
    strip = lambda ms: [{k: v for k, v in m.items() if not any(w in k for w in volatile)} for m in ms]  # noqa: E731
    assert strip(read_metrics(str(two))) == strip(ms)


def test_a_warn_reaches_tensorboard_and_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    cfg = tiny_run(run, steps=2, run={"report_to": ["tensorboard", "wandb"]},
                   monitor={"alarms": [{"name": "low_entropy", "detector": "entropy_floor", "threshold": 100.0,
                                        "window": 1}]})
    train(cfg, log=lambda s: None)
    ms = read_metrics(str(run))
    assert ms[0]["alarm/low_entropy"] == 1.0 and "alarm/low_entropy" not in ms[1]  # once, at its first step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run / "tb"))
    ea.Reload()
    assert "alarm/low_entropy" in ea.Tags()["scalars"]
    ident = open(run / "wandb_id").read().strip()
    [sitting] = [d for d in os.listdir(run / "wandb") if d.startswith("offline-run-")]
    assert b"alarm/low_entropy" in open(run / "wandb" / sitting / f"run-{ident}.wandb", "rb").read()


def test_offline_rescoring_gives_the_live_alarms(tmp_path):
    """Every detector on a run with an evaluation at every step: what `scope alarms RUN` fires is what the run
    fired, alarm by alarm and step by step; the command prints it."""
    from scope.alarms import replay
    from scope.cli import main

    panel = tmp_path / "panel.yaml"
    panel.write_text("episodes: 2\npartners:\n  - {id: a, seen: true, model: policy, max_new_tokens: 4}\n"
                     "  - {id: b, seen: false, model: policy, temperature: 1.3, max_new_tokens: 4}\n")
    alarms = [{"name": n, "detector": d, "threshold": t, "window": w} for n, d, t, w in (
        ("exploit", "exploit", -5.0, 2), ("gap", "gap", -5.0, 2), ("entropy", "entropy_floor", 100.0, 2),
        ("similar", "self_similarity_ceiling", -1.0, 2), ("flat", "zero_variance_ceiling", 0.5, 1))]
    run = tmp_path / "run"
    train(tiny_run(run, steps=4, eval={"panel": str(panel), "every": 1, "at_start": True},
                   monitor={"alarms": alarms}), log=lambda s: None)
    live = [(e["name"], e["step"]) for m in read_metrics(str(run)) for e in m.get("alarm_events", [])]
    assert {n for n, _ in live} >= {"entropy", "similar"}  # thresholds every run passes
    from scope.configfile import load_config

    offline = [(a.name, a.step) for a in replay(str(run), load_config(str(run / "config.yaml")).monitor.alarms)]
    assert offline == live
    assert main(["alarms", str(run)]) == 0


def test_bad_alarm_configs_are_one_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="needs monitor.fallback"):
        tiny_run(tmp_path, monitor={"alarms": [{"name": "s", "detector": "gap", "action": "switch"}]})
    with pytest.raises(ConfigError, match="read the panel's evaluations"):
        tiny_run(tmp_path, monitor={"alarms": [{"name": "e", "detector": "exploit"}]})
    with pytest.raises(ConfigError, match="used twice"):
        tiny_run(tmp_path, monitor={"alarms": [{"name": "a", "detector": "entropy_floor"},
                                               {"name": "a", "detector": "zero_variance_ceiling"}]})
    with pytest.raises(ConfigError, match="monitor.fallback"):
        tiny_run(tmp_path, monitor={"alarms": [{"name": "s", "detector": "entropy_floor", "action": "switch"}],
                                    "fallback": {"model": "nowhere"}})


def _synthetic_run(tmp_path, rewards, unseen_by_step, family_other=None):
    """A run directory by hand: training rewards per step, and at the steps of ``unseen_by_step`` an evaluation of
    8 tasks where the seen member scores 0.5 and each unseen member ``unseen_by_step[step]`` (plus a task noise of
    up to 0.1 that differs from one evaluation to the next)."""
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s + 1, "reward_mean": r}) + "\n"
                                               for s, r in enumerate(rewards)))
    members = {"s": (True, "fam", True), "u": (False, "fam", True)}
    if family_other is not None:
        members["o"] = (False, "other", False)
    for step, level in unseen_by_step.items():
        d = run / "eval" / f"step_{step:06d}"
        d.mkdir()
        eps = []
        for m, (seen, _, _) in members.items():
            base = 0.5 if seen else (family_other[step] if m == "o" else level)
            eps += [{"task_id": f"t{t}", "group_id": f"{step}:{m}", "status": "done", "meta": {"partner": m},
                     "rewards": {"agent": base + 0.05 * ((2 * t + step) % 5 - 2)}} for t in range(8)]
        (d / "eval_episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
        (d / "eval.json").write_text(json.dumps({"per_partner": {m: {"seen": s, "n": 8, "family": f,
                                                                      "training_family": tf}
                                                                  for m, (s, f, tf) in members.items()}}))
    return run


def test_the_exploit_detector_reads_a_paired_fall_while_the_reward_rises(tmp_path):
    from scope.alarms import History, exploit
    from scope.run import read_metrics

    def fire(rewards, unseen, other=None, sub="a"):
        run = _synthetic_run(tmp_path / sub, rewards, unseen, other)
        return exploit(History(str(run), read_metrics(str(run))), 2.0, 3)

    rising = [0.1, 0.2, 0.3, 0.5, 0.7, 0.9]
    z, msg = fire(rising, {0: 0.5, 3: 0.4, 6: 0.1}, sub="fall")
    assert z > 2 and "fell 0.41" in msg and "between steps 0 and 6" in msg  # the window's first and last evaluation
    assert fire([0.9, 0.8, 0.7, 0.5, 0.3, 0.1], {0: 0.5, 3: 0.4, 6: 0.1}, sub="no_rise") is None
    z, _ = fire(rising, {0: 0.5, 3: 0.4, 6: 0.5}, sub="flat")
    assert abs(z) < 2  # no fall: within the noise
    # with a member of another family among the unseen, it is that member's fall that counts
    z, msg = fire(rising, {0: 0.5, 3: 0.4, 6: 0.1}, other={0: 0.5, 3: 0.5, 6: 0.5}, sub="family")
    assert "(o)" in msg and abs(z) < 2


def test_the_gap_detector_reads_a_widening_seen_minus_unseen_gap(tmp_path):
    from scope.alarms import History, gap
    from scope.run import read_metrics

    run = _synthetic_run(tmp_path, [0.1] * 6, {0: 0.5, 3: 0.45, 6: 0.2})
    z, msg = gap(History(str(run), read_metrics(str(run))), 2.0, 3)
    assert z > 2 and "widened by 0.3" in msg and "between steps 0 and 6" in msg
