"""Collapse alarms (``monitor.alarms``): detectors that read a run as it trains, and what the run does when one
fires.

A detector reads the run's metrics so far (``metrics.jsonl``, this step's line included) and its held-out
evaluations so far (``eval/step_N``), and fires once, at the first step its rule holds:

- ``exploit``: the training reward rises while the held-out unseen reward falls, over the last ``window``
  evaluations (the step-0 one included): the unseen reward at the first of them minus at the last, paired over
  the evaluation's tasks, is at least ``threshold`` standard errors, and the training reward (the mean of the last
  4 steps; at step 0, of the first 4) rose between those two evaluations. The unseen members of another model
  family than the training simulators' are read where the panel has them (an exploit their family does not
  share), else every unseen member;
- ``gap``: the seen-minus-unseen gap widens over the last ``window`` evaluations by at least ``threshold``
  standard errors (paired over the tasks);
- ``entropy_floor``: the policy's token entropy, the mean of the last ``window`` steps, falls below
  ``threshold`` nats;
- ``self_similarity_ceiling``: the agent's self-BLEU within a group, the mean of the last ``window`` steps,
  rises above ``threshold``;
- ``zero_variance_ceiling``: the share of groups whose rewards are all equal, the mean of the last ``window``
  steps, rises above ``threshold``;
- ``partner_modal_mass_ceiling``: the partner's behaviour modal mass at the fixed probe states (its last
  measurement) rises above ``threshold``.

Actions: ``warn`` (a log line, ``alarm/<name>`` to every tracker, the event in ``metrics.jsonl`` and a mark on
the run's curves), ``stop`` (the same, then the run ends at that step: a checkpoint, ``stop_reason`` in its last
metrics line and ``alarms.md``), ``switch`` (the same, then the partner plays ``monitor.fallback`` from the next
step on; the switch is in the metrics and a resumed run starts from it). The live check and the offline one
(``scope alarms RUN``) read the same files with the same functions, so they fire at the same steps.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

from .stats import TRAIN_WINDOW, task_bootstrap

DEFAULTS: dict[str, dict[str, float]] = {
    # the thresholds and windows a detector takes when its config leaves them out: each threshold is the candidate
    # with the most hits, then the fewest false alarms, on one set of runs (a recipe's, where a collapse is known),
    # then held against runs it was not chosen on; docs/evaluation.md, "Collapse alarms", says which and how it did
    "exploit": {"threshold": 2.0, "window": 3},
    "gap": {"threshold": 2.5, "window": 3},
    "entropy_floor": {"threshold": 0.15, "window": 4},
    "self_similarity_ceiling": {"threshold": 0.9, "window": 4},
    "zero_variance_ceiling": {"threshold": 0.8, "window": 4},
    "partner_modal_mass_ceiling": {"threshold": 0.99, "window": 1},
}
WINDOW_KEYS = {"entropy_floor": "policy_entropy", "self_similarity_ceiling": "agent_self_bleu",
               "zero_variance_ceiling": "zero_variance_frac",
               "partner_modal_mass_ceiling": "partner_behaviour/modal_mass"}
"""The metric each step detector reads."""


@dataclass
class Alarm:
    name: str
    detector: str
    step: int
    value: float
    threshold: float
    action: str
    message: str


class History:
    """What a detector reads at a step: the metrics lines so far (by step) and the run's evaluations so far."""

    def __init__(self, run_dir: str, metrics: list[dict[str, Any]]):
        self.run_dir, self.metrics = run_dir, metrics
        self._evals: dict[int, Any] | None = None

    @property
    def step(self) -> int:
        return int(self.metrics[-1]["step"]) if self.metrics else 0

    def evals(self) -> tuple[dict[int, Any], dict[str, Any], dict[str, Any]]:
        """The evaluations up to this step: cells by step, each member's seen flag, and each member's family."""
        from .grid.summary import eval_cells

        cells, seen, _, fams = eval_cells(self.run_dir)
        return {s: c for s, c in cells.items() if s <= self.step}, seen, fams

    def first(self, key: str, n: int) -> float | None:
        vals = [m[key] for m in self.metrics if key in m and isinstance(m[key], (int, float))][:n]
        return sum(vals) / len(vals) if vals else None

    def window(self, key: str, n: int, end: int | None = None) -> float | None:
        vals = [m[key] for m in self.metrics if key in m and isinstance(m[key], (int, float))
                and (end is None or m["step"] <= end)]
        vals = vals[-n:]
        return sum(vals) / len(vals) if vals else None


def _groups(seen: dict[str, Any], fams: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(seen members, the unseen members the exploit detector reads: another family's where there are some)."""
    unseen = [k for k, v in seen.items() if v is False]
    other = [k for k in unseen if k in fams and not fams[k][1]]
    return [k for k, v in seen.items() if v is True], (other or unseen)


def exploit(h: History, threshold: float, window: int) -> tuple[float, str] | None:
    cells, seen, fams = h.evals()
    steps = sorted(cells)[-window:]
    if len(steps) < window:
        return None
    _, unseen = _groups(seen, fams)
    first, last = steps[0], steps[-1]
    d = task_bootstrap([cells[first]], unseen, minus=[cells[last]])  # the fall, paired over the tasks
    end = h.window("reward_mean", TRAIN_WINDOW, last)
    # the training reward at the first evaluation: its last steps then, or (at step 0) the run's first steps
    start = h.window("reward_mean", TRAIN_WINDOW, first)
    if start is None:
        start = h.first("reward_mean", TRAIN_WINDOW)
    if end is None or start is None or not d["se"] or math.isnan(d["se"]) or end - start <= 0:
        return None
    rise = end - start
    z = d["mean"] / d["se"]
    return z, (f"training reward +{rise:.3f} while the unseen reward ({', '.join(unseen)}) fell {d['mean']:.3f} "
               f"between steps {first} and {last} ({z:.1f} paired s.e.)")


def gap(h: History, threshold: float, window: int) -> tuple[float, str] | None:
    cells, seen, fams = h.evals()
    steps = sorted(cells)[-window:]
    if len(steps) < window:
        return None
    seen_ids, _ = _groups(seen, fams)
    unseen = [k for k, v in seen.items() if v is False]
    first, last = cells[steps[0]], cells[steps[-1]]

    def g(c):  # per task: the seen members' mean minus the unseen members'
        tasks = set.intersection(*(set(c.get(m, {})) for m in seen_ids + unseen))
        return {t: sum(c[m][t] for m in seen_ids) / len(seen_ids) - sum(c[m][t] for m in unseen) / len(unseen)
                for t in tasks}

    a, b = g(first), g(last)
    d = task_bootstrap([{"gap": b}], ["gap"], minus=[{"gap": a}])
    if not d["se"] or math.isnan(d["se"]):
        return None
    z = d["mean"] / d["se"]
    return z, (f"the seen-minus-unseen gap widened by {d['mean']:.3f} between steps {steps[0]} and {steps[-1]} "
               f"({z:.1f} s.e.)")


def _step_detector(detector: str, below: bool):
    def detect(h: History, threshold: float, window: int) -> tuple[float, str] | None:
        key = WINDOW_KEYS[detector]
        n = sum(1 for m in h.metrics if key in m)
        v = h.window(key, window)
        if v is None or n < window:
            return None
        # the value is reported so that "fires" always means value >= threshold: a floor's is negated
        return (-v if below else v), f"{key} {v:.3f} (mean of its last {window}) {'<' if below else '>'} {threshold}"
    return detect


DETECTORS: dict[str, Callable[[History, float, int], tuple[float, str] | None]] = {
    "exploit": exploit, "gap": gap,
    "entropy_floor": _step_detector("entropy_floor", below=True),
    "self_similarity_ceiling": _step_detector("self_similarity_ceiling", below=False),
    "zero_variance_ceiling": _step_detector("zero_variance_ceiling", below=False),
    "partner_modal_mass_ceiling": _step_detector("partner_modal_mass_ceiling", below=False),
}


def settings(a) -> tuple[float, int]:
    """An alarm's threshold and window, its detector's defaults where the config leaves them out."""
    d = DEFAULTS[a.detector]
    return (d["threshold"] if a.threshold is None else a.threshold), int(d["window"] if a.window is None else a.window)


def check(alarms: list, h: History, fired: set[str]) -> list[Alarm]:
    """The alarms of ``alarms`` (``monitor.alarms``) that fire at this step and had not fired before."""
    out = []
    for a in alarms:
        if a.name in fired:
            continue
        threshold, window = settings(a)
        got = DETECTORS[a.detector](h, threshold, window)
        if got is None:
            continue
        value, message = got
        limit = -threshold if a.detector == "entropy_floor" else threshold
        if value >= limit:
            out.append(Alarm(a.name, a.detector, h.step, value, threshold, a.action, message))
    return out


def fired_before(metrics: list[dict[str, Any]]) -> tuple[set[str], int | None]:
    """The alarms already fired in these metrics lines, and the step the partner was switched at (None)."""
    names = {e["name"] for m in metrics for e in m.get("alarm_events", [])}
    switched = next((int(m["step"]) for m in metrics if m.get("partner_switched")), None)
    return names, switched


def replay(run_dir: str, alarms: list) -> list[Alarm]:
    """The alarms of ``alarms`` as the run would have fired them live, step by step from its files."""
    from .run import read_metrics

    ms = [{k: v for k, v in m.items() if not k.startswith("alarm")} for m in read_metrics(run_dir)]
    fired: set[str] = set()
    out: list[Alarm] = []
    for i in range(len(ms)):
        got = check(alarms, History(run_dir, ms[:i + 1]), fired)
        fired |= {a.name for a in got}
        out += got
    return out


class Watch:
    """A run's alarms as it trains: checked after each step's metrics, before they are written."""

    def __init__(self, cfg, run_dir: str, log: Callable[[str], None]):
        from .run import read_metrics

        self.alarms, self.run_dir, self.log = cfg.monitor.alarms, run_dir, log
        done = read_metrics(run_dir) if os.path.exists(os.path.join(run_dir, "metrics.jsonl")) else []
        self.fired, self.switched = fired_before(done)

    def step(self, step: int, metrics: dict[str, Any]) -> str | None:
        """Check the alarms with this step's metrics; record what fired in them; return ``stop``, ``switch``
        or None."""
        from .run import read_metrics

        done = read_metrics(self.run_dir) if os.path.exists(os.path.join(self.run_dir, "metrics.jsonl")) else []
        got = check(self.alarms, History(self.run_dir, done + [{**metrics, "step": step}]), self.fired)
        if not got:
            return None
        self.fired |= {a.name for a in got}
        record(metrics, got)
        for a in got:
            self.log(f"ALARM {a.name} ({a.detector}) at step {step}: {a.message}; action: {a.action}")
        if any(a.action == "stop" for a in got):
            a = next(a for a in got if a.action == "stop")
            metrics["stop_reason"] = f"alarm {a.name} ({a.detector}) at step {step}: {a.message}"
            return "stop"
        if any(a.action == "switch" for a in got) and self.switched is None:
            self.switched = step
            metrics["partner_switched"] = 1.0
            return "switch"
        return None


def switched_by(run_dir: str, upto: int) -> int | None:
    """The step a ``switch`` alarm switched the partner at, if it did at or before step ``upto`` (a resumed run
    starts from its checkpoint at ``upto``, with the partner it had then)."""
    from .run import read_metrics

    if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return None
    return fired_before([m for m in read_metrics(run_dir) if m.get("step", 0) <= upto])[1]


def record(metrics: dict[str, Any], got: list[Alarm]) -> None:
    """Put the step's alarms into its metrics line: ``alarm/<name>`` for the trackers and the events."""
    for a in got:
        metrics[f"alarm/{a.name}"] = 1.0
    metrics["alarm_events"] = [asdict(a) for a in got]


def markdown(events: list[Alarm], stopped: str | None = None) -> str:
    lines = ["# Alarms", "", "| step | alarm | detector | value | threshold | action | what |", "|---" * 7 + "|"]
    lines += [f"| {a.step} | {a.name} | {a.detector} | {a.value:.3f} | {a.threshold} | {a.action} | {a.message} |"
              for a in events]
    if not events:
        lines.append("| | none fired | | | | | |")
    if stopped:
        lines += ["", f"The run stopped: {stopped}"]
    return "\n".join(lines) + "\n"


def write_summary(run_dir: str, metrics: list[dict[str, Any]]) -> str:
    """``alarms.md`` of a run: every alarm that fired, from its metrics lines."""
    events = [Alarm(**e) for m in metrics for e in m.get("alarm_events", [])]
    stopped = next((m["stop_reason"] for m in metrics if m.get("stop_reason")), None)
    path = os.path.join(run_dir, "alarms.md")
    with open(path, "w") as f:
        f.write(markdown(events, stopped))
    with open(os.path.join(run_dir, "alarms.json"), "w") as f:
        json.dump({"alarms": [asdict(a) for a in events], "stopped": stopped}, f, indent=1)
    return path
