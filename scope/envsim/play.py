"""tau2 with simulated tools (``env.options.tools: simulated``): the ``envsim`` role answers the agent's tool
calls, and the exact tools run beside it.

At each tool call of the agent, the exact tool runs on the episode's real database (which the grade reads)
and gives the label; the simulator sees, in one growing conversation (its view: the instructions once, then
one user message per call), the records that call reads as the simulator's own state has them (its earlier
answers' changes applied), and answers with the JSON of ``simulate.SYSTEM``. What it answers is what the
agent gets back. Its state changes are applied to its own state (``constrained``: checked first, sent back
once for repair, then the call fails as a tool error). Each call is labelled: the feedback right (FM), and
the simulator's records after the call equal to the real ones (CM); ``meta.envsim`` holds the labels and
their means, and the ``envsim`` role's reward is the share of calls with both right, so a trainable
simulator learns to play the tools faithfully.
"""
from __future__ import annotations

import json
from typing import Any

from ..envs.tau2.db import OverlayDB
from ..envs.tau2.tools import DOMAINS
from .samples import slice_db, run_call
from .simulate import SYSTEM, feedback_match, parse, violations
from .state import BadChange, apply, canon, diff

UNREADABLE = "Error: the tool simulator's answer could not be read"
FAILED = "Error: the simulated tool could not complete the call"


MAX_RECORDS = 12


def relevant(records: dict[str, dict[str, Any]], args: dict, limit: int = MAX_RECORDS) -> dict[str, dict[str, Any]]:
    """The records a call reads, as shown to the simulator: all of them when they are few; when the call read
    many (a lookup by name over every user, say), those whose key or content holds one of the call's
    argument values, at most ``limit`` (the retrieval a simulator needs to answer, no more)."""
    n = sum(len(v) for v in records.values())
    if n <= limit:
        return records
    needles = [str(v) for v in _scalars(args) if str(v)]
    out: dict[str, dict[str, Any]] = {}
    kept = 0
    for t, recs in records.items():
        for k, v in recs.items():
            text = k + " " + json.dumps(v)
            if kept < limit and needles and all(x in text for x in needles[:3]):
                out.setdefault(t, {})[k] = v
                kept += 1
    return out


def _scalars(x: Any):
    if isinstance(x, dict):
        for v in x.values():
            yield from _scalars(v)
    elif isinstance(x, list):
        for v in x:
            yield from _scalars(v)
    elif x is not None:
        yield x


def _restrict(state: dict, shown: dict, changes: list[dict[str, Any]]) -> dict:
    """``state`` cut to the records shown to the simulator and the records the exact call changed."""
    keys = {(t, k) for t, recs in shown.items() for k in recs}
    for c in changes:
        parts = c["path"].split(".")
        if len(parts) >= 2:
            keys.add((parts[0], parts[1]))
        elif c["type"] == "add" and isinstance(c.get("value"), dict):  # a whole table added
            keys |= {(parts[0], k) for k in c["value"]}
    out: dict[str, dict[str, Any]] = {}
    for t, k in keys:
        if k in state.get(t, {}):
            out.setdefault(t, {})[k] = state[t][k]
    return out


class SimulatedTools:
    def __init__(self, env, constrained: bool = False, policy: str | None = None):
        self.env, self.constrained = env, constrained
        self.domain = env.domain
        self.state = OverlayDB(env.data["db"], env.upstream_quirks)  # what the simulator believes
        self.pending: dict[str, Any] | None = None
        self.labels: list[dict[str, Any]] = []
        self.last_name: str | None = None
        self.last_args: Any = None
        self.last_error = False
        system = SYSTEM.format(domain=self.domain)  # each call brings its own tool's schema
        if policy:
            system += "\n\nThe system's policy:\n" + policy
        env.views["envsim"] = [{"role": "system", "content": system}]

    def call(self, name: str, args: Any) -> None:
        """The agent called a tool: run the exact one, and ask the simulator."""
        exact = run_call(self.domain, self.env.db, name, args)
        keys = {(t, k) for t, recs in exact["state"].items() for k in recs} | \
               {(t, k) for t, recs in exact["next_state"].items() for k in recs}
        believed = relevant(slice_db(self.state, keys), args)
        self.pending = {"name": name, "args": args, "exact": exact, "state": believed, "repaired": False}
        self.last_name, self.last_args = name, args
        self.env.views["envsim"].append({"role": "user", "content": (
            f"Tool schema: {json.dumps(DOMAINS[self.domain][name].schema())}\n\nDatabase records: "
            f"{json.dumps(believed)}\n\nCall: {name}({json.dumps(args)})")})

    def on_reply(self, text: str) -> str | None:
        """The simulator's answer: the result for the agent, or None when it is sent back for repair."""
        p = self.pending
        assert p is not None, "an envsim reply with no tool call pending"
        self.env.views["envsim"].append({"role": "assistant", "content": text})
        fb, ch = parse(text)
        sample = {"domain": self.domain, "tool": p["name"], "state": p["state"]}
        problems = violations(sample, ch) if self.constrained and fb is not None else []
        if problems and not p["repaired"]:
            p["repaired"] = True
            self.env.views["envsim"].append({"role": "user", "content": "Your changes break these rules:\n- "
                                             + "\n- ".join(problems) + "\nAnswer again with the corrected JSON."})
            return None
        label: dict[str, Any] = {"tool": p["name"], "repaired": p["repaired"]}
        changes: list[dict[str, Any]]
        if fb is None:
            result, changes, label["unreadable"] = UNREADABLE, [], True
        elif problems:
            result, changes, label["failed"] = FAILED, [], True
        else:
            result, changes = fb, ch or []
        try:
            after = apply(p["state"], changes)
        except BadChange:
            after, label["unappliable"] = p["state"], True
        self._store(p["state"], after)
        truth = _restrict(p["exact"]["next_state"], p["state"], p["exact"]["changes"])  # the records it was shown,
        label["fm"] = feedback_match(result, p["exact"]["feedback"])                   # and those the call changes
        label["cm"] = canon(_restrict(after, p["state"], p["exact"]["changes"])) == canon(truth)
        label["wrong_fields"] = [c["path"] for c in diff(after, truth)][:20]
        self.labels.append(label)
        self.pending = None
        self.last_error = result.startswith("Error:")
        return result

    def _store(self, before: dict, after: dict) -> None:
        """Write the simulator's believed records back into its state (records it deleted are dropped)."""
        for t, recs in after.items():
            if t not in self.state.over:
                continue
            for k, v in recs.items():
                self.state.put(t, k, v)
        for t, recs in before.items():
            for k in recs:
                if k not in after.get(t, {}) and t in self.state.over:
                    self.state.over[t].pop(k, None)

    def summary(self) -> dict[str, Any]:
        n = len(self.labels)
        mean = (lambda key: sum(bool(x.get(key)) for x in self.labels) / n if n else 1.0)  # noqa: E731
        return {"calls": n, "fm": mean("fm"), "cm": mean("cm"),
                "accuracy": sum(x["fm"] and x["cm"] for x in self.labels) / n if n else 1.0,
                "repaired": sum(x["repaired"] for x in self.labels), "unreadable": sum(bool(x.get("unreadable"))
                                                                                    for x in self.labels),
                "labels": self.labels}
